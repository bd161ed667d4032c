// The CPU backend's memory: 64-byte-aligned host blocks through the caching allocator.
#include "engine/backend/cpu/cpu_backend.hpp"

#include <cstdlib>
#include <cstring>

namespace relgrad {

// the allocator asks for multiples of 64 bytes, as aligned_alloc wants
static void* aligned_host_block(std::size_t nbytes) { return std::aligned_alloc(64, nbytes); }

CpuBackend::CpuBackend(Device device) : Backend(device), allocator_(aligned_host_block, std::free) {}

bool CpuBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return offers_fused_attention_;
        case OptionalKernel::bfloat16_gemm: return cpu::fast_bfloat16_gemm();
        case OptionalKernel::float16_gemm: return false;  // oneDNN 2.6 has none for these CPUs
        case OptionalKernel::fused_attention_16_bit: return cpu::fast_bfloat16_gemm();  // float16: on copies
        case OptionalKernel::elementwise_16_bit: return true;
    }
    return false;
}

void CpuBackend::copy_from_host(const void* host, void* device, std::size_t nbytes) {
    if (nbytes) std::memcpy(device, host, nbytes);
}

void CpuBackend::copy_to_host(const void* device, void* host, std::size_t nbytes) {
    if (nbytes) std::memcpy(host, device, nbytes);
}

}  // namespace relgrad
