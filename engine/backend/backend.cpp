// The table of backends by device, and the defaults of the optional kernels.
#include "engine/backend/backend.hpp"

#include <stdexcept>
#include <string>

#include "engine/backend/cpu/cpu_backend.hpp"

namespace relgrad {

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

CpuBackend& guarded_cpu_backend() {
    static CpuBackend* const guarded = new CpuBackend(Device::guarded_cpu);  // never destroyed, as below
    return *guarded;
}

// The backends live as long as the program (never destroyed), so that a tensor freed during
// static destruction still finds its allocator.
Backend& backend_for(Device device) {
    static CpuBackend* const cpu = new CpuBackend(Device::cpu);
    switch (device) {
        case Device::cpu: return *cpu;
        case Device::guarded_cpu: return guarded_cpu_backend();
        case Device::cuda: break;
    }
    throw std::invalid_argument(std::string("no backend is built for the ") + device_name(device) +
                                " device in this build");
}

}  // namespace relgrad
