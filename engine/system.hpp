// relgrad: what relgrad asks of the operating system: a file read whole, a file or a directory
// replaced whole, a lock on a file or directory, and the peak memory of the process.
//
// A directory is replaced in three moves: the new content is written into <dir>.partial/, then
// two renames swap it in, dir/ -> dir.previous/ and dir.partial/ -> dir/, and the old content is
// removed. Stopped at any point, one whole directory remains: dir/, or dir.previous/ between the
// two renames, which recover_directory() renames back. Module::save, the trainer's checkpoints
// and `relgrad data fetch` write their directories this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace relgrad {

// Refuses (std::invalid_argument) anything at `path` but a regular file, before it is opened: a
// FIFO or a device would block the read or never end it. `what` says what the file should be:
//     runs/x/config.json: is a directory, expected the run's config
//     data/a.tsv: a loop of symbolic links, expected a data file
void require_regular_file(const std::filesystem::path& path, const std::string& what);

// The whole content of the regular file `path` (require_regular_file first). `what` says what the file should be; it is
// named in the one-line errors (std::invalid_argument) for a missing file, a directory, a read failure:
//     runs/x/config.json: is a directory, expected the run's config
std::string read_file(const std::filesystem::path& path, const std::string& what);
// The same file opened for reading a part at a time (binary), with the same checks and errors.
// Its stream buffer's underflow throws std::ios_base::failure when read(2) fails (EIO, say, for
// /proc/self/mem); a reader catches it and calls read_failed.
std::ifstream open_file(const std::filesystem::path& path, const std::string& what);
// Throws the one-line error (std::invalid_argument) for a read of `path` that failed just now:
//     /proc/self/mem: read failed (Input/output error), expected a data file
[[noreturn]] void read_failed(const std::filesystem::path& path, const std::string& what);

// Writes `bytes` to <path>.partial, then renames it to path: a reader sees the old file or the new
// one, whole, never a part (a full disk leaves the old file and no .partial behind). Errors are
// std::runtime_error: "out/y.npy: cannot write (disk full? permission denied?)".
void write_file(const std::filesystem::path& path, const std::string& bytes);

// A std::filesystem::filesystem_error in one line, the path first and the system's reason, not
// libstdc++'s words: "runs/loop: Too many levels of symbolic links". The command line and Python
// report every such error this way.
std::string filesystem_error_line(const std::filesystem::filesystem_error& error);

// Creates the directory `dir` (and its parents) for what a command writes; a file in the way, or a
// directory that cannot be made, is std::invalid_argument naming it and `what` it was to be:
//     runs/a/x: cannot create the run's directory (Not a directory)
void create_output_directory(const std::filesystem::path& dir, const std::string& what);

// Empties and creates <dir>.partial/ and returns it: the new content of dir goes there.
std::filesystem::path start_replacing(const std::filesystem::path& dir);

// Swaps the written <dir>.partial/ in for dir/ (which need not exist yet).
void finish_replacing(const std::filesystem::path& dir);

// Renames a dir.previous/ left by a finish_replacing() stopped between its renames back to dir/;
// returns whether dir/ exists.
bool recover_directory(const std::filesystem::path& dir);

// An flock(2) on a file or a directory: shared (any number of holders) or exclusive (one, and no
// shared holder). The kernel releases it when the FileLock is destroyed or its process ends in
// any way, so a process killed with SIGKILL leaves no stale lock. The trainer's one writer per
// run and its checkpoint swap use it (train/run_directory.hpp).
class FileLock {
public:
    enum class Kind { shared, exclusive };
    // Waits until `path` (an existing file or directory, opened for reading) can be locked.
    FileLock(const std::filesystem::path& path, Kind kind);
    // An exclusive lock on the file `path` (created if missing) if no one holds it now, its
    // content then replaced by `note` (say, the holder's pid); nothing if another holds it.
    static std::optional<FileLock> try_exclusive(const std::filesystem::path& path, const std::string& note);
    FileLock(FileLock&& other) noexcept;
    FileLock& operator=(FileLock&&) = delete;
    FileLock(const FileLock&) = delete;
    ~FileLock();

private:
    explicit FileLock(int fd) : fd_(fd) {}
    int fd_;
};

// FNV-1a (64 bits) of `size` bytes, going on from `hash` (a fingerprint of several pieces): what
// finds that memory or a file changed, not a cryptographic hash (it does not stop a forgery).
constexpr uint64_t kFingerprintStart = 14695981039346656037ull;
uint64_t fingerprint(const void* bytes, std::size_t size, uint64_t hash = kFingerprintStart);
// A fingerprint written as 16 hex digits ("00ab...").
std::string fingerprint_hex(uint64_t hash);
// The fingerprint of a directory's regular files (names and contents, in name order), as 16 hex
// digits; errors name the file that could not be read.
std::string directory_fingerprint(const std::filesystem::path& dir);

// Sets the OpenMP thread count after starting that many threads at once: libgomp ends the process
// (exit 1, in its own words) when it cannot start one, so a count the machine cannot hold (under a
// memory limit, say) is refused here instead, std::invalid_argument naming `what` (--threads).
void set_thread_count(int64_t threads, const std::string& what);

// The most memory the process has held resident so far, in MiB.
double peak_rss_mib();

// The most memory this process may have, in bytes, and what sets it (`source`): the least of the
// machine's physical memory, its cgroup's limit (memory.max, or cgroup v1's
// memory.limit_in_bytes) and the address space RLIMIT_AS (ulimit -v) leaves beyond what the
// process maps already.
struct MemoryLimit {
    double bytes;
    std::string source;
};
MemoryLimit memory_limit();

// A size in bytes as people read it: "512 bytes", "3.0 KiB", "1.2 GiB".
std::string readable_bytes(double bytes);

}  // namespace relgrad
