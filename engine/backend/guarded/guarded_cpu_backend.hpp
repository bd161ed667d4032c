// The guarded CPU device: the CPU backend's kernels, registered as a device whose memory the host
// API refuses to touch: Tensor::data<T>() throws, and only to(), copy_(), to_vector() and item()
// copy its values out, as they would from a GPU. It has its own allocator, so its own
// memory_stats. Every op, layer and training run that passes on it is device-clean: it never
// reads device memory from the host, never mixes devices, and allocates on its inputs' device.
// The tests run on it beside the CPU and expect identical results.
#pragma once

#include "engine/backend/cpu/cpu_backend.hpp"

namespace relgrad {

class GuardedCpuBackend final : public CpuBackend {
public:
    const char* name() const override { return "guarded_cpu"; }
    bool supports(OptionalKernel kernel) const override;

    // Whether it offers the fused attention kernels (on by default); off, the fused op must fall
    // back to the bucketed one, which the tests check.
    bool offers_fused_attention = true;
};

GuardedCpuBackend& guarded_cpu_backend();

}  // namespace relgrad
