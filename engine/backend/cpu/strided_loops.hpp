// The CPU kernels' loops over strided tensors: xtensor views of a tensor's strided memory (strided,
// input), a walk over every multi-index with its offsets under several strides (walk), the
// split of flat work between threads (in_chunks), and the float32 copies of the 16-bit layouts
// the packed loops leave (on_float32_copies).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xbroadcast.hpp>

#include <omp.h>

#include "engine/backend/backend.hpp"

namespace relgrad {
namespace cpu {

// An xtensor view of t's elements in place. xtensor wants the adapted buffer to hold exactly
// prod(shape) elements, so a dim that expand() stretched (stride 0) is handed over as size 1 and
// broadcast back by xtensor (see `input`); the elements themselves are reached through strides.
template <class T>
auto strided(const Tensor& t) {
    const int64_t rank = t.dim();
    std::vector<std::size_t> shape(rank);
    std::vector<std::ptrdiff_t> strides(rank);
    std::size_t size = 1;
    for (int64_t d = 0; d < rank; ++d) {
        const bool stretched = t.strides()[d] == 0 || t.shape()[d] == 1;
        shape[d] = stretched && t.shape()[d] > 0 ? 1 : static_cast<std::size_t>(t.shape()[d]);
        strides[d] = stretched ? 0 : t.strides()[d];
        size *= shape[d];
    }
    return xt::adapt(device_data<T>(t), size, xt::no_ownership(), shape, strides);
}

// An input operand, broadcast to the output's shape.
template <class T>
auto input(const Tensor& t, const Tensor& out) {
    const std::vector<std::size_t> shape(out.shape().begin(), out.shape().end());
    return xt::broadcast(strided<T>(t), shape);
}

// Visits every multi-index of `shape` in C order and calls fn(offsets), where offsets[k] is the
// element offset of that multi-index under strides[k]. Used by the index kernels and copy.
template <std::size_t N, class F>
void walk(const Shape& shape, const std::array<Shape, N>& strides, F&& fn) {
    const int64_t total = shape_numel(shape);
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::vector<int64_t> counter(rank, 0);
    std::array<int64_t, N> offsets{};
    for (int64_t n = 0; n < total; ++n) {
        fn(offsets);
        for (int64_t d = rank - 1; d >= 0; --d) {
            if (++counter[d] < shape[d]) {
                for (std::size_t k = 0; k < N; ++k) offsets[k] += strides[k][d];
                break;
            }
            for (std::size_t k = 0; k < N; ++k) offsets[k] -= strides[k][d] * (shape[d] - 1);
            counter[d] = 0;
        }
    }
}

// Splits [0, n) into one contiguous chunk per thread (a single chunk when n is small, where
// threads would cost more than they save) and calls f(begin, end) for each. Chunks start at
// multiples of 64 elements, so a SIMD loop inside meets the same batches and the same scalar tail
// whatever the thread count: the results do not depend on it.
template <class F>
void in_chunks(int64_t n, F&& f) {
    constexpr int64_t align = 64;
    const int64_t threads = n >= (int64_t{1} << 15) ? omp_get_max_threads() : 1;
    auto boundary = [&](int64_t t) { return t == threads ? n : n * t / threads / align * align; };
#pragma omp parallel for schedule(static) if (threads > 1)
    for (int64_t t = 0; t < threads; ++t) f(boundary(t), boundary(t + 1));
}

// What a kernel does with a 16-bit layout its packed loops do not take (a strided view, a broadcast
// on both sides): what a device without elementwise_16_bit does for every call. compute(wide)
// runs the kernel on float32 copies (Backend::widened) into wide, a float32 buffer of out's
// shape, which is then rounded into out once.
template <class Compute>
void on_float32_copies(Backend& backend, Tensor& out, Compute&& compute) {
    Tensor wide = empty(out.shape(), DType::float32, out.device());
    compute(wide);
    backend.copy(wide, out);
}

}  // namespace cpu
}  // namespace relgrad
