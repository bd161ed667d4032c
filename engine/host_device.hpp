// relgrad: RELGRAD_HOST_DEVICE marks a function that host code and CUDA kernels both call: nvcc
// compiles it for both sides (__host__ __device__); the host compiler, which also builds the
// kernels for the emulator, sees a plain function.
#pragma once

#ifdef __CUDACC__
#define RELGRAD_HOST_DEVICE __host__ __device__
#else
#define RELGRAD_HOST_DEVICE
#endif
