#include "engine/system.hpp"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <future>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/errors.hpp"

namespace relgrad {

namespace fs = std::filesystem;

namespace {

fs::path with_suffix(const fs::path& dir, const char* suffix) { return dir.string() + suffix; }

}  // namespace

void require_regular_file(const fs::path& path, const std::string& what) {
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    RELGRAD_CHECK(error != std::errc::too_many_symbolic_link_levels, path.string(),
                  ": a loop of symbolic links, expected ", what);
    RELGRAD_CHECK(fs::exists(status), path.string(), ": missing, expected ", what);
    RELGRAD_CHECK(!fs::is_directory(status), path.string(), ": is a directory, expected ", what);
    RELGRAD_CHECK(fs::is_regular_file(status), path.string(), ": not a regular file (a FIFO or a device), expected ",
                  what);
}

std::ifstream open_file(const fs::path& path, const std::string& what) {
    require_regular_file(path, what);
    std::ifstream in(path, std::ios::binary);
    RELGRAD_CHECK(in, path.string(), ": cannot open, expected ", what);
    return in;
}

std::string read_file(const fs::path& path, const std::string& what) {
    std::ifstream in = open_file(path, what);
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    RELGRAD_CHECK(!in.bad(), path.string(), ": read failed, expected ", what);
    return text;
}

void write_file(const fs::path& path, const std::string& bytes) {
    const fs::path partial = with_suffix(path, ".partial");
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        out << bytes;
        out.close();
        if (!out) {
            std::error_code ignored;
            fs::remove(partial, ignored);
            throw std::runtime_error(path.string() + ": cannot write (disk full? permission denied?)");
        }
    }
    fs::rename(partial, path);
}

void create_output_directory(const fs::path& dir, const std::string& what) {
    RELGRAD_CHECK(!dir.empty(), "an empty path, expected ", what);
    std::error_code error;
    fs::create_directories(dir, error);
    if (!error && !fs::is_directory(dir)) error = std::make_error_code(std::errc::not_a_directory);
    RELGRAD_CHECK(!error, dir.string(), ": cannot create ", what, " (", error.message(), ")");
}

fs::path start_replacing(const fs::path& dir) {
    const fs::path partial = with_suffix(dir, ".partial");
    fs::remove_all(partial);  // left by a write that was stopped
    fs::create_directories(partial);
    return partial;
}

void finish_replacing(const fs::path& dir) {
    const fs::path previous = with_suffix(dir, ".previous");
    fs::remove_all(previous);
    if (fs::exists(dir)) fs::rename(dir, previous);
    fs::rename(with_suffix(dir, ".partial"), dir);
    fs::remove_all(previous);  // only once the new content is in place
}

uint64_t fingerprint(const void* bytes, std::size_t size, uint64_t hash) {
    const auto* byte = static_cast<const unsigned char*>(bytes);
    for (std::size_t i = 0; i < size; ++i) hash = (hash ^ byte[i]) * 1099511628211ull;
    return hash;
}

std::string directory_fingerprint(const fs::path& dir) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    uint64_t hash = kFingerprintStart;
    for (const fs::path& file : files) {
        const std::string name = file.filename().string(), content = read_file(file, "a file of " + dir.string());
        hash = fingerprint(name.data(), name.size() + 1, hash);  // with the name's terminating 0
        hash = fingerprint(content.data(), content.size(), hash);
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    return hex;
}

void set_thread_count(int64_t threads, const std::string& what) {
    RELGRAD_CHECK(threads >= 1, what, " ", threads, ": expected at least 1");
    std::promise<void> started;
    const std::shared_future<void> all_started = started.get_future().share();
    std::vector<std::thread> probe;  // alive together, as OpenMP's team is: each waits for the last
    try {
        for (int64_t i = 1; i < threads; ++i) probe.emplace_back([all_started] { all_started.wait(); });
    } catch (const std::system_error& e) {
        started.set_value();
        for (std::thread& t : probe) t.join();
        throw std::invalid_argument(what + " " + std::to_string(threads) + ": this machine could not start " +
                                    std::to_string(threads) + " threads at once (" + e.code().message() +
                                    "); use fewer");
    }
    started.set_value();
    for (std::thread& t : probe) t.join();
    omp_set_num_threads(static_cast<int>(threads));
}

bool recover_directory(const fs::path& dir) {
    const fs::path previous = with_suffix(dir, ".previous");
    if (!fs::exists(dir) && fs::exists(previous)) fs::rename(previous, dir);
    return fs::exists(dir);
}

double peak_rss_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace relgrad
