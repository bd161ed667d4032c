// The values a kernel checks as it reads them, worded alike on every device: an index outside its
// dim, a bucket outside [0, K), a float converted to int64 that has no int64 value. The CPU's
// kernels check as they read (RELGRAD_CHECK, which builds the message only on failure); a CUDA
// kernel reports the bad value to the backend's error record, which the host reads at its next copy
// from the device (cuda_backend.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "engine/host_device.hpp"

namespace relgrad {

// Whether the float v converts to an int64: not NaN nor infinite, and inside +-9.2e18 (2^63 is
// about 9.22e18). Compared in v's own type, as the conversion itself would be.
template <class F>
RELGRAD_HOST_DEVICE inline bool has_int64_value(F v) {
    return v > F(-9.2e18) && v < F(9.2e18);
}

// "gather: index 7 is out of range for dim 1 of size 5"
std::string index_out_of_range(const char* kernel, int64_t index, int64_t dim, int64_t size);
// "attention: bucket 9 in the relative index is outside [0, 5)"
std::string bucket_out_of_range(int64_t bucket, int64_t buckets);
// "conversion to int64: nan has no int64 value"
std::string no_int64_value(double value);

}  // namespace relgrad
