// relgrad: a check and its message in one call, as ATen's TORCH_CHECK(cond, "expected ", a, ...):
//
//   RELGRAD_CHECK(step > 0, "slice: step must be positive, got ", step);
//
// throws std::invalid_argument when the condition is false, its message the parts written one
// after the other with operator<<. It is a macro so that the parts are evaluated only then: a
// check that passes costs its condition alone, and may sit in a kernel's inner loop. An integer is
// written as std::to_string writes it; a double as operator<< does (1e-05), so a message that
// shows six decimals (0.000010) passes std::to_string(x). nvcc compiles it too (the CUDA
// backend's host code).
#pragma once

#include <sstream>
#include <stdexcept>

namespace relgrad {
namespace detail {

template <class... Parts>
[[noreturn]] void throw_invalid_argument(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw std::invalid_argument(message.str());
}

}  // namespace detail
}  // namespace relgrad

#define RELGRAD_CHECK(condition, ...)                                             \
    do {                                                                          \
        if (!(condition)) ::relgrad::detail::throw_invalid_argument(__VA_ARGS__); \
    } while (false)
