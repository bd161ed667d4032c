#include "engine/system.hpp"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
    std::string text;
    try {
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure&) {  // read(2) failed: the system's reason, not libstdc++'s words
        read_failed(path, what);
    }
    RELGRAD_CHECK(!in.bad(), path.string(), ": read failed, expected ", what);
    return text;
}

void read_failed(const fs::path& path, const std::string& what) {
    RELGRAD_CHECK(false, path.string(), ": read failed (", std::strerror(errno), "), expected ", what);
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

std::string filesystem_error_line(const fs::filesystem_error& error) {
    std::string paths = error.path1().string();
    if (!error.path2().empty()) paths += " -> " + error.path2().string();
    return (paths.empty() ? std::string() : paths + ": ") + error.code().message();
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

FileLock::FileLock(const fs::path& path, Kind kind) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    RELGRAD_CHECK_RUNTIME(fd_ >= 0, path.string(), ": cannot open to lock it (", std::strerror(errno), ")");
    int locked;
    do {
        locked = ::flock(fd_, kind == Kind::shared ? LOCK_SH : LOCK_EX);
    } while (locked != 0 && errno == EINTR);  // a signal (Ctrl-C) arrived while waiting
    if (locked != 0) {
        const int error = errno;
        ::close(fd_);
        RELGRAD_CHECK_RUNTIME(false, path.string(), ": cannot lock (", std::strerror(error), ")");
    }
}

std::optional<FileLock> FileLock::try_exclusive(const fs::path& path, const std::string& note) {
    FileLock lock(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    RELGRAD_CHECK_RUNTIME(lock.fd_ >= 0, path.string(), ": cannot create or open the lock file (", std::strerror(errno),
                          ")");
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
        RELGRAD_CHECK_RUNTIME(errno == EWOULDBLOCK, path.string(), ": cannot lock (", std::strerror(errno), ")");
        return std::nullopt;
    }
    // written over the old note, then cut to length: a reader never finds it emptied
    const bool noted = ::pwrite(lock.fd_, note.data(), note.size(), 0) == static_cast<ssize_t>(note.size()) &&
                       ::ftruncate(lock.fd_, static_cast<off_t>(note.size())) == 0;
    RELGRAD_CHECK_RUNTIME(noted, path.string(), ": cannot write (", std::strerror(errno), ")");
    return lock;
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

FileLock::~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
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
    return fingerprint_hex(hash);
}

std::string fingerprint_hex(uint64_t hash) {
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

namespace {

// The number a file such as memory.max holds, or nothing ("max", missing, unreadable).
std::optional<double> number_in(const fs::path& path) {
    std::ifstream in(path);
    double value = 0;
    if (in >> value) return value;
    return std::nullopt;
}

// The memory limit of this process's cgroup, when it has one.
std::optional<double> cgroup_limit() {
    std::ifstream cgroups("/proc/self/cgroup");
    for (std::string line; std::getline(cgroups, line);) {
        if (line.rfind("0::", 0) == 0) {  // cgroup v2: 0::/its/path
            if (auto limit = number_in("/sys/fs/cgroup" + line.substr(3) + "/memory.max")) return limit;
        }
    }
    if (auto limit = number_in("/sys/fs/cgroup/memory.max")) return limit;  // a container's own root
    return number_in("/sys/fs/cgroup/memory/memory.limit_in_bytes");        // cgroup v1
}

}  // namespace

MemoryLimit memory_limit() {
    const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE));
    MemoryLimit limit{static_cast<double>(sysconf(_SC_PHYS_PAGES)) * page, "physical memory"};
    if (const std::optional<double> cgroup = cgroup_limit(); cgroup && *cgroup < limit.bytes) {
        limit = {*cgroup, "the cgroup's memory limit"};
    }
    rlimit address_space{};
    if (getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY) {
        const double mapped = number_in("/proc/self/statm").value_or(0) * page;  // its first number: pages mapped
        const double left = std::max(0.0, static_cast<double>(address_space.rlim_cur) - mapped);
        if (left < limit.bytes) limit = {left, "RLIMIT_AS (ulimit -v), less what the process maps already"};
    }
    return limit;
}

std::string readable_bytes(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int unit = 0;
    for (; bytes >= 1024 && unit < 6; ++unit) bytes /= 1024;
    char text[32];
    std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
    return text;
}

double peak_rss_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace relgrad
