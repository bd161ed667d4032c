// relgrad: the processes that train one run. Under mpirun (or Slurm's srun) they are MPI's ranks;
// otherwise this process alone, rank 0 of 1. The trainer asks for nothing but what is here:
// collectives whose result does not depend on how MPI carries them out (gathers, whose result is
// every rank's data side by side, and a sum of rows in row order that MPI only moves the bytes
// of, never a sum MPI may order as it likes), and an end to every process when one of them fails
// (docs/distributed.md).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace relgrad {

class Processes {
public:
    // The run's processes, MPI started on first use when mpirun started this one; a build without
    // MPI (RELGRAD_MPI) started by mpirun on several processes is refused.
    static Processes& world();

    int rank() const { return rank_; }
    int count() const { return count_; }
    bool leader() const { return rank_ == 0; }  // the one that writes the run's files

    // Every process's `mine`, each of the same length, side by side in rank order, into `all` on
    // every process (which keeps its memory from one call to the next: an allgather of 12.7 MB a
    // process into memory MPI had not seen took 46 ms here, into the same memory again 4 ms).
    void gather(const std::vector<float>& mine, std::vector<float>& all) const;
    void gather(const std::vector<double>& mine, std::vector<double>& all) const;
    // The same for texts of any length.
    std::vector<std::string> gather(const std::string& mine) const;

    // The sum of the rows of `width` floats that all processes hold, added in row order
    // (add_in_row_order below), into `total` on every process. Each holds as many rows, process
    // r's `mine` being rows [r k, (r + 1) k) of them all. A reduce-scatter by columns, then an
    // allgather: process p receives every process's rows of its share of the columns, adds them
    // in row order, and the sums are gathered; so a process sends and receives under (k + 1)
    // width floats each way whatever the process count, and no sum is MPI's. `scratch` keeps the
    // memory of the steps between calls.
    struct RowScratch {
        std::vector<float> to_send, received, my_columns;
    };
    void add_rows(const std::vector<float>& mine, std::size_t width, std::vector<float>& total,
                  RowScratch& scratch) const;

    // What a process that failed returns from main, after printing `line` (its error) on stderr
    // at once, as "rank R: line" in a run on several processes: `code`, after ending every other
    // process (MPI_Abort), which would otherwise wait for it in a gather forever.
    static int ending(const std::string& line, int code);

private:
    Processes(int rank, int count) : rank_(rank), count_(count) {}
    int rank_, count_;
};

// Rows of `width` floats one after another (every shard's gradient, or every shard's part of a
// process's columns in add_rows): their sum, added left to right in float32, row 0 first. The
// order is the rows', never the processes': the same bits whichever process computed which row
// (docs/distributed.md).
// Into `total`, whose memory is kept from one call to the next.
void add_in_row_order(const std::vector<float>& rows, std::size_t width, std::vector<float>& total);

}  // namespace relgrad
