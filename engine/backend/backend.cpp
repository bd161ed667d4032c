// The table of backends by device, and the defaults of the optional kernels.
#include "engine/backend/backend.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/backend/cpu/cpu_backend.hpp"

namespace relgrad {

#ifdef RELGRAD_HAVE_CUDA
namespace cuda {
Backend& gpu_backend();  // cuda_backend.cu (compiled by nvcc; its header is CUDA's)
}
#endif

// The optional kernels a backend leaves out: reaching one is a bug in the op that called it.
void Backend::fused_attention(const Tensor&, const Tensor&, const Tensor&, const AttentionPattern&, double,
                              const ClippedRelativeTerms&, Tensor&, Tensor&) {
    throw std::logic_error(std::string("fused_attention: the ") + name() + " backend has no fused kernel");
}
void Backend::fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const AttentionPattern&, double, const ClippedRelativeTerms&,
                                       Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
    throw std::logic_error(std::string("fused_attention_backward: the ") + name() + " backend has no fused kernel");
}

BlasOperand blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
    if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
        return {true, false, rows == 1 ? std::max<int64_t>(cols, 1) : row_stride};
    }
    if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
        return {true, true, cols == 1 ? std::max<int64_t>(rows, 1) : col_stride};
    }
    return {false, false, 0};
}

CpuBackend& guarded_cpu_backend() {
    static CpuBackend* const guarded = new CpuBackend(Device::guarded_cpu);  // never destroyed, as below
    return *guarded;
}

Backend*& installed_cuda_backend() {
    static Backend* installed = nullptr;
    return installed;
}
void install_cuda_backend(Backend& backend) { installed_cuda_backend() = &backend; }

// The backends live as long as the program (never destroyed), so that a tensor freed during
// static destruction still finds its allocator.
Backend& backend_for(Device device) {
    static CpuBackend* const cpu = new CpuBackend(Device::cpu);
    switch (device) {
        case Device::cpu: return *cpu;
        case Device::guarded_cpu: return guarded_cpu_backend();
        case Device::cuda:
            if (Backend* installed = installed_cuda_backend()) return *installed;
#ifdef RELGRAD_HAVE_CUDA
            return cuda::gpu_backend();
#else
            throw std::runtime_error("no usable CUDA device: this relgrad is built without CUDA (RELGRAD_CUDA=OFF)");
#endif
    }
    throw std::invalid_argument(std::string("no backend is built for the ") + device_name(device) +
                                " device in this build");
}

}  // namespace relgrad
