// The test build's cuda device: the CUDA backend's kernels compiled for the host and run in the
// emulator of CUDA's execution model (engine/backend/cuda/emulator.hpp), installed before main.
// RELGRAD_CUDA_EMULATOR=0 leaves the cuda device to a real GPU (scripts/cuda_check.sh).
#include <cstdlib>
#include <cstring>

#include "engine/backend/cuda/cuda_backend.hpp"

namespace {

const bool emulated_cuda_installed = [] {
    const char* setting = std::getenv("RELGRAD_CUDA_EMULATOR");
    if (setting && std::strcmp(setting, "0") == 0) return false;
    relgrad::install_cuda_backend(relgrad::cuda_emulated::cuda_backend());
    return true;
}();

}  // namespace
