// The CPU's reductions (engine/ops/reduce.cpp) and the softmax over the last dim (engine/ops/nn.cpp),
// a reduction per row. float32 sums accumulate in float64.
#include <algorithm>
#include <cmath>
#include <limits>

#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>

#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/cpu/strided_loops.hpp"

namespace relgrad {

using namespace cpu;

namespace {

// The sum of n values in float64, in 8 interleaved partial sums (element j goes to sum j % 8)
// added pairwise at the end: one running sum is a chain of dependent additions, 8 of them fill a
// SIMD register. The order is fixed, so the result does not depend on the thread count; for
// float32 values the float64 sums are exact unless the values' magnitudes span more than about
// 2^29, so the float32 result is that of any order.
template <class T>
double row_sum(const T* values, int64_t n) {
    constexpr int64_t lanes = 8;
    double partial[lanes] = {};
    int64_t j = 0;
    for (; j + lanes <= n; j += lanes)
        for (int64_t l = 0; l < lanes; ++l) partial[l] += values[j + l];
    for (int64_t l = 0; j < n; ++j, ++l) partial[l] += values[j];
    return ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

// A float64 sum as a T: through float for the 16-bit types, the value a float32 kernel would
// give and its rounding to 16 bits
template <class T>
T rounded(double total) {
    return static_cast<T>(static_cast<compute_type<T>>(total));
}

// The two common sums as plain loops: a packed x summed over its leading dims (the bias gradient:
// one sum per column) or over its trailing dims (one sum per row). float64 accumulators; 16-bit
// tensors are read as they are.
template <class T>
bool packed_sum(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    if (!x.is_contiguous() || !out.is_contiguous() || x.numel() == 0) return false;
    const int64_t rank = x.dim(), count = static_cast<int64_t>(dims.size());
    const bool leading = dims.front() == 0 && dims.back() == count - 1;
    const bool trailing = dims.front() == rank - count && dims.back() == rank - 1;
    if (!leading && !trailing) return false;
    const int64_t reduced = shape_numel(Shape(x.shape().begin() + dims.front(), x.shape().begin() + dims.back() + 1));
    const int64_t kept = x.numel() / reduced;
    const T* in = device_data<T>(x);
    T* o = device_data<T>(out);
    if (trailing) {
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
        for (int64_t i = 0; i < kept; ++i) o[i] = rounded<T>(row_sum(in + i * reduced, reduced));
    } else {
        std::vector<double> totals(kept, 0.0);
        for (int64_t i = 0; i < reduced; ++i)
            for (int64_t j = 0; j < kept; ++j) totals[j] += in[i * kept + j];
        for (int64_t j = 0; j < kept; ++j) o[j] = rounded<T>(totals[j]);
    }
    return true;
}

}  // namespace

void CpuBackend::do_reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    dispatch_real(x.dtype(), "reduce", [&](auto tag) {
        using T = decltype(tag);
        if (op == ReduceOp::sum && packed_sum<T>(x, dims, out)) return;
        if constexpr (is_16_bit_v<T>) {  // another layout, or max
            on_float32_copies(*this, out, [&](Tensor& wide) { do_reduce(op, widened(x), dims, wide); });
        } else {
            const std::vector<std::size_t> axes(dims.begin(), dims.end());
            auto X = input<T>(x, x);
            auto O = strided<T>(out);
            if (op == ReduceOp::sum) {
                // float32 sums accumulate in float64: adding 2^25 ones one by one in float32 stops at 2^24
                xt::noalias(O) = xt::cast<T>(xt::sum(xt::cast<double>(X), axes, xt::keep_dims));
            } else {
                // xt::amax skips NaN; relgrad's max, like PyTorch's, is NaN when any element is
                const auto nan_count = xt::eval(xt::sum(xt::cast<int64_t>(xt::isnan(X)), axes, xt::keep_dims));
                xt::noalias(O) =
                    xt::where(nan_count > 0, std::numeric_limits<T>::quiet_NaN(), xt::amax(X, axes, xt::keep_dims));
            }
        }
    });
}

void CpuBackend::do_softmax_last_dim(const Tensor& x, int64_t rows, int64_t columns, bool log, Tensor& out) {
    dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
        using T = decltype(tag);
        const T* px = device_data<T>(x);
        T* po = device_data<T>(out);
        const T neg_inf = -std::numeric_limits<T>::infinity();
        for (int64_t r = 0; r < rows; ++r) {
            const T* row = px + r * columns;
            T* dst = po + r * columns;
            T m = neg_inf;
            for (int64_t j = 0; j < columns; ++j) m = std::max(m, row[j]);
            if (m == neg_inf) {  // every entry masked: no probability mass anywhere
                std::fill(dst, dst + columns, log ? neg_inf : T(0));
                continue;
            }
            T total(0);
            for (int64_t j = 0; j < columns; ++j) total += std::exp(row[j] - m);
            const T log_total = std::log(total);
            for (int64_t j = 0; j < columns; ++j) {
                dst[j] = log ? row[j] - m - log_total : std::exp(row[j] - m) / total;
            }
        }
    });
}

}  // namespace relgrad
