// relgrad: a check and its message in one call, as ATen's TORCH_CHECK(cond, "expected ", a, ...):
//
//   RELGRAD_CHECK(step > 0, "slice: step must be positive, got ", step);
//
// throws std::invalid_argument when the condition is false, its message the parts written one
// after the other with operator<<. It is a macro so that the parts are evaluated only then: a
// check that passes costs its condition alone, and may sit in a kernel's inner loop. An integer is
// written as std::to_string writes it; a double as operator<< does (1e-05), so a message that
// shows six decimals (0.000010) passes std::to_string(x). A std::filesystem::path is written in
// quotes by operator<<, so a message passes path.string(). nvcc compiles it too (the CUDA
// backend's host code).
//
// Three macros, one for each kind of failure; the exception's type tells the caller whose fault
// it is (Python sees ValueError, RuntimeError and RuntimeError):
//
//   RELGRAD_CHECK(cond, parts...)            std::invalid_argument: the caller gave bad input (an
//                                            argument, a config value, a command-line flag). The
//                                            caller can fix it by calling differently.
//   RELGRAD_CHECK_RUNTIME(cond, parts...)    std::runtime_error: the input was fine, but the world
//                                            outside the program failed it: a file that cannot be
//                                            opened or written, a data file whose contents are
//                                            wrong, a command or another process that fails, an
//                                            environment variable that is missing.
//   RELGRAD_INTERNAL_ASSERT(cond, parts...)  std::logic_error: a bug in relgrad, whatever the
//                                            input; e.g. a switch that missed an enum value. Its
//                                            message starts "relgrad internal error: ".
//
// A failure with no condition to test (the end of a function that every case returns from
// earlier) passes false: RELGRAD_INTERNAL_ASSERT(false, "unknown dtype ", int(dtype)).
#pragma once

#include <sstream>
#include <stdexcept>

namespace relgrad {
namespace detail {

template <class Error, class... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw Error(message.str());
}

}  // namespace detail
}  // namespace relgrad

#define RELGRAD_CHECK(condition, ...)                                                         \
    do {                                                                                      \
        if (!(condition)) ::relgrad::detail::throw_error<std::invalid_argument>(__VA_ARGS__); \
    } while (false)

#define RELGRAD_CHECK_RUNTIME(condition, ...)                                              \
    do {                                                                                   \
        if (!(condition)) ::relgrad::detail::throw_error<std::runtime_error>(__VA_ARGS__); \
    } while (false)

#define RELGRAD_INTERNAL_ASSERT(condition, ...)                                                                      \
    do {                                                                                                             \
        if (!(condition)) ::relgrad::detail::throw_error<std::logic_error>("relgrad internal error: ", __VA_ARGS__); \
    } while (false)
