// The CPU backend's memory (64-byte-aligned host blocks through the caching allocator), the device
// check every kernel starts with, and its fused kernels forwarded to fused_attention.cpp.
#include "engine/backend/cpu/cpu_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/backend/cpu/kernels.hpp"

namespace relgrad {

// the allocator asks for multiples of 64 bytes, as aligned_alloc wants
static void* aligned_host_block(std::size_t nbytes) { return std::aligned_alloc(64, nbytes); }

CpuBackend::CpuBackend(Device device) : device_(device), allocator_(aligned_host_block, std::free) {}

bool CpuBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return offers_fused_attention;
    }
    return false;
}

void CpuBackend::require_on_device(const char* kernel, std::initializer_list<const Tensor*> operands) const {
    for (const Tensor* t : operands) {
        if (t->defined() && t->device() != device_) {
            throw std::logic_error(std::string(kernel) + ": an operand on the " + device_name(t->device()) +
                                   " device reached the " + device_name(device_) + " kernels");
        }
    }
}

void CpuBackend::copy_from_host(const void* host, void* device, std::size_t nbytes) {
    if (nbytes) std::memcpy(device, host, nbytes);
}

void CpuBackend::copy_to_host(const void* device, void* host, std::size_t nbytes) {
    if (nbytes) std::memcpy(host, device, nbytes);
}

void CpuBackend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                                 double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    require_on_device("fused_attention", {&q, &k, &v, &pattern.mask, &relative.table_k, &relative.table_v, &z, &lse});
    cpu::use_one_blas_thread();
    cpu::fused_attention_forward(q, k, v, pattern, scale, relative, z, lse);
}

void CpuBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                          const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                          double scale, const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk,
                                          Tensor& dv, Tensor& d_table_k, Tensor& d_table_v) {
    require_on_device("fused_attention_backward", {&q, &k, &v, &z, &lse, &dz, &pattern.mask, &relative.table_k,
                                                   &relative.table_v, &dq, &dk, &dv, &d_table_k, &d_table_v});
    cpu::use_one_blas_thread();
    cpu::fused_attention_backward(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v);
}

}  // namespace relgrad
