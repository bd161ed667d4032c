#include "train/processes.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "engine/errors.hpp"

#ifdef RELGRAD_WITH_MPI
#include <mpi.h>
#endif

namespace relgrad {

namespace {

// Whether a launcher started this process as one of an MPI job: Open MPI's mpirun, or a PMI one
// such as Slurm's srun --mpi=pmix (which may set a rank and no size); and the size it says, 0
// when it says none (MPI then tells).
bool launched_by_mpi() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMIX_SIZE", "PMI_SIZE"}) {
        if (std::getenv(name)) return true;
    }
    return false;
}
#ifndef RELGRAD_WITH_MPI
int launched_size() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
        if (const char* value = std::getenv(name)) return std::max(0, std::atoi(value));
    }
    return 0;
}
#endif

// n values as one of MPI's counts (an int): more in one exchange is refused, not wrapped
int mpi_count(std::size_t n) {
    RELGRAD_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()), "exchanging ", n,
                  " values at once between processes: MPI counts stop at 2^31 - 1 (fewer shards a process, or fewer "
                  "parameters)");
    return static_cast<int>(n);
}

#ifdef RELGRAD_WITH_MPI
// MPI_Finalize when the program ends, after a normal return or an exception handled in main.
struct Finalize {
    ~Finalize() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
};

// One gather of `count` values of `type` from each process into `out` (count * processes).
void gather_into(const void* mine, int count, MPI_Datatype type, void* out) {
    // MPI's default handler ends the job on a failed collective (a process gone): no status to check
    MPI_Allgather(mine, count, type, out, count, type, MPI_COMM_WORLD);
}
#endif

}  // namespace

Processes& Processes::world() {
    static Processes processes = [] {
#ifdef RELGRAD_WITH_MPI
        if (launched_by_mpi()) {
            // every thread but the main one is OpenMP's, which never calls MPI
            int provided = 0;
            MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
            static Finalize finalize;
            int rank = 0, count = 1;
            MPI_Comm_rank(MPI_COMM_WORLD, &rank);
            MPI_Comm_size(MPI_COMM_WORLD, &count);
            return Processes(rank, count);
        }
#else
        RELGRAD_CHECK(!launched_by_mpi() || launched_size() == 1,
                      "this relgrad was built without MPI (RELGRAD_MPI): it cannot train as one of the processes an "
                      "MPI launcher started");
#endif
        return Processes(0, 1);
    }();
    return processes;
}

void Processes::gather(const std::vector<float>& mine, std::vector<float>& all) const {
    if (count_ == 1) {
        all = mine;
        return;
    }
    all.resize(mine.size() * static_cast<std::size_t>(count_));
#ifdef RELGRAD_WITH_MPI
    gather_into(mine.data(), mpi_count(mine.size()), MPI_FLOAT, all.data());
#endif
}

void Processes::gather(const std::vector<double>& mine, std::vector<double>& all) const {
    if (count_ == 1) {
        all = mine;
        return;
    }
    all.resize(mine.size() * static_cast<std::size_t>(count_));
#ifdef RELGRAD_WITH_MPI
    gather_into(mine.data(), mpi_count(mine.size()), MPI_DOUBLE, all.data());
#endif
}

std::vector<std::string> Processes::gather(const std::string& mine) const {
    if (count_ == 1) return {mine};
    // the lengths first, then every text padded to the longest
    std::vector<double> lengths;
    gather(std::vector<double>{static_cast<double>(mine.size())}, lengths);
    std::size_t longest = 0;
    for (double length : lengths) longest = std::max(longest, static_cast<std::size_t>(length));
    std::string padded = mine;
    padded.resize(longest);
    std::string all(longest * static_cast<std::size_t>(count_), '\0');
#ifdef RELGRAD_WITH_MPI
    gather_into(padded.data(), mpi_count(longest), MPI_CHAR, all.data());
#endif
    std::vector<std::string> texts;
    for (int rank = 0; rank < count_; ++rank) {
        texts.push_back(all.substr(static_cast<std::size_t>(rank) * longest, static_cast<std::size_t>(lengths[rank])));
    }
    return texts;
}

void Processes::add_rows(const std::vector<float>& mine, std::size_t width, std::vector<float>& total,
                         RowScratch& scratch) const {
    RELGRAD_CHECK(width > 0 && mine.size() % width == 0, "add_rows: ", mine.size(), " values are not rows of ", width);
    mpi_count(mine.size() * static_cast<std::size_t>(count_));  // every offset below fits an int
    if (count_ == 1) {
        add_in_row_order(mine, width, total);
        return;
    }
#ifdef RELGRAD_WITH_MPI
    const std::size_t processes = static_cast<std::size_t>(count_), rows = mine.size() / width;
    const auto first_column = [&](std::size_t p) { return p * width / processes; };  // process p's columns start
    const std::size_t mine_first = first_column(static_cast<std::size_t>(rank_));
    const std::size_t my_width = first_column(static_cast<std::size_t>(rank_) + 1) - mine_first;
    // the reduce-scatter: to process p, my rows' columns of p, row after row
    std::vector<int> send_counts(processes), send_offsets(processes), receive_counts(processes),
        receive_offsets(processes);
    scratch.to_send.resize(mine.size());
    std::size_t at = 0;
    for (std::size_t p = 0; p < processes; ++p) {
        const std::size_t begin = first_column(p), columns = first_column(p + 1) - begin;
        send_offsets[p] = static_cast<int>(at);
        for (std::size_t row = 0; row < rows; ++row, at += columns) {
            std::copy(mine.begin() + static_cast<std::ptrdiff_t>(row * width + begin),
                      mine.begin() + static_cast<std::ptrdiff_t>(row * width + begin + columns),
                      scratch.to_send.begin() + static_cast<std::ptrdiff_t>(at));
        }
        send_counts[p] = static_cast<int>(at) - send_offsets[p];
        receive_counts[p] = static_cast<int>(rows * my_width);  // process p's rows of my columns
        receive_offsets[p] = static_cast<int>(p * rows * my_width);
    }
    scratch.received.resize(processes * rows * my_width);
    MPI_Alltoallv(scratch.to_send.data(), send_counts.data(), send_offsets.data(), MPI_FLOAT, scratch.received.data(),
                  receive_counts.data(), receive_offsets.data(), MPI_FLOAT, MPI_COMM_WORLD);
    // received in rank order, each process's rows in order: all the rows in row order
    add_in_row_order(scratch.received, my_width, scratch.my_columns);
    // the allgather of every process's column sums
    for (std::size_t p = 0; p < processes; ++p) {
        receive_counts[p] = static_cast<int>(first_column(p + 1) - first_column(p));
        receive_offsets[p] = static_cast<int>(first_column(p));
    }
    total.resize(width);
    MPI_Allgatherv(scratch.my_columns.data(), static_cast<int>(my_width), MPI_FLOAT, total.data(),
                   receive_counts.data(), receive_offsets.data(), MPI_FLOAT, MPI_COMM_WORLD);
#else
    (void)scratch;
#endif
}

void add_in_row_order(const std::vector<float>& rows, std::size_t width, std::vector<float>& total) {
    total.assign(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(std::min(width, rows.size())));
    for (std::size_t start = width; width > 0 && start < rows.size(); start += width) {
        for (std::size_t e = 0; e < width; ++e) total[e] += rows[start + e];
    }
}

int Processes::ending(const std::string& line, int code) {
    int rank = 0, count = 1;
#ifdef RELGRAD_WITH_MPI
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &count);
    }
#endif
    // one write, so that the lines of several processes do not interleave
    const std::string text = (count > 1 ? "rank " + std::to_string(rank) + ": " : "") + line + "\n";
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
#ifdef RELGRAD_WITH_MPI
    if (count > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    return code;
}

}  // namespace relgrad
