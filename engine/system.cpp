#include "engine/system.hpp"

#include <sys/resource.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

#include "engine/check.hpp"

namespace relgrad {

namespace fs = std::filesystem;

namespace {

fs::path with_suffix(const fs::path& dir, const char* suffix) { return dir.string() + suffix; }

}  // namespace

std::string read_file(const fs::path& path, const std::string& what) {
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    RELGRAD_CHECK(fs::exists(status), path.string(), ": missing, expected ", what);
    RELGRAD_CHECK(!fs::is_directory(status), path.string(), ": is a directory, expected ", what);
    RELGRAD_CHECK(fs::is_regular_file(status), path.string(), ": not a regular file, expected ", what);
    std::ifstream in(path, std::ios::binary);
    RELGRAD_CHECK(in, path.string(), ": cannot open, expected ", what);
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
