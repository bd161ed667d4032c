// What the harnesses of tests/fuzz/ share: a scratch directory of their own (one per process, so
// that fuzzers may run side by side, removed at exit), writing an input into a file there, and
// the rule for findings.
//
// The rule: relgrad reports bad input by throwing a std::exception subclass (std::runtime_error,
// std::invalid_argument); a harness catches those and returns 0. Everything else is a finding:
// a crash, an ASan / UBSan report, a leak, an uncaught exception of another type, a hang, or a
// broken round trip, which a harness reports through finding() (abort with a message, so that
// libFuzzer saves the input).
#pragma once

#include <omp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace relgrad_fuzz {

namespace fs = std::filesystem;

// /tmp/relgrad-fuzz-<harness>-<pid>/, created on first use and removed when the process ends.
inline const fs::path& scratch_dir(const char* harness = "fuzz") {
    static const fs::path dir = [harness] {
        const fs::path path = fs::temp_directory_path() / (std::string("relgrad-fuzz-") + harness + "-" +
                                                           std::to_string(static_cast<long>(getpid())));
        fs::remove_all(path);
        fs::create_directories(path);
        std::atexit([] {
            std::error_code ignored;
            fs::remove_all(scratch_dir(), ignored);
        });
        return path;
    }();
    return dir;
}

inline void write_file(const fs::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
        std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.string().c_str());
        std::abort();
    }
}

// A broken property (a round trip that does not round-trip): print and abort, so the input is kept.
[[noreturn]] inline void finding(const std::string& what) {
    std::fprintf(stderr, "FINDING: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

// One OpenMP thread: the inputs are small, and two spinning threads on a shared 2-core machine
// slow each other down (tests/CMakeLists.txt says more).
inline void single_thread() { omp_set_num_threads(1); }

}  // namespace relgrad_fuzz
