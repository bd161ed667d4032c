#include "engine/backend/guarded/guarded_cpu_backend.hpp"

namespace relgrad {

bool GuardedCpuBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return offers_fused_attention;
    }
    return false;
}

GuardedCpuBackend& guarded_cpu_backend() {
    static GuardedCpuBackend* const backend = new GuardedCpuBackend();  // never destroyed, as the CPU's
    return *backend;
}

}  // namespace relgrad
