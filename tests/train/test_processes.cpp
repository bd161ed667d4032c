// The processes of a run (train/processes.hpp), run by ctest under mpirun on 1, 2 and 4 processes:
// gathers put every process's values side by side in rank order, and shards added in shard order
// (by a gather, or by a reduce-scatter and an allgather) give the same bits whichever process
// computed which shard, where a sum in another order (what MPI_Allreduce may pick) does not.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/random.hpp"
#include "train/processes.hpp"

#ifdef RELGRAD_WITH_MPI
#include <mpi.h>
#endif

using namespace relgrad;

TEST_CASE("a gather puts every process's values side by side, in rank order") {
    const Processes& processes = Processes::world();
    const int rank = processes.rank(), count = processes.count();
    MESSAGE("rank " << rank << " of " << count);
    std::vector<float> floats;
    std::vector<double> doubles;
    processes.gather(std::vector<float>{float(10 * rank), float(10 * rank + 1)}, floats);
    processes.gather(std::vector<double>{0.5 * rank}, doubles);
    const std::vector<std::string> texts =
        processes.gather(std::string(static_cast<std::size_t>(rank + 1), 'a' + rank));
    REQUIRE(floats.size() == static_cast<std::size_t>(2 * count));
    REQUIRE(texts.size() == static_cast<std::size_t>(count));
    for (int r = 0; r < count; ++r) {
        CHECK(floats[2 * r] == float(10 * r));
        CHECK(floats[2 * r + 1] == float(10 * r + 1));
        CHECK(doubles[r] == 0.5 * r);
        CHECK(texts[r] == std::string(static_cast<std::size_t>(r + 1), 'a' + r));  // texts of other lengths
    }
}

TEST_CASE("shards added in shard order give the same bits on any process count; another order does not") {
    // Four numbers whose float32 sum depends on the order: left to right, 1e8 + 1 rounds to 1e8
    // (float32's step there is 8), so ((1e8 + 1) - 1e8) + 1 = 1; in pairs, as a reduction tree
    // adds them, (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0.
    const std::vector<float> four = {1e8f, 1.0f, -1e8f, 1.0f};
    std::vector<float> sum;
    add_in_row_order(four, 1, sum);
    CHECK(sum == std::vector<float>{1.0f});
    volatile float left = four[0] + four[1], right = four[2] + four[3];
    CHECK(left + right == 0.0f);

    // S = 4 shards of 1000 random values each, the same on every process (one seed); each of the P
    // processes holds S / P of them, gathers all and adds them in shard order: the bits of the
    // sum one process makes of all four, on 1, 2 or 4 processes
    const Processes& processes = Processes::world();
    const int64_t shards = 4, width = 1000;
    REQUIRE(shards % processes.count() == 0);
    Generator gen(3);
    std::vector<float> all;
    for (int64_t e = 0; e < shards * width; ++e) {  // large and small values, so that order shows
        const double u = gen.next_uniform();
        all.push_back(static_cast<float>((u - 0.5) * (e % 3 == 0 ? 1e6 : 1.0)));
    }
    const int64_t mine = shards / processes.count(), first = processes.rank() * mine;
    const std::vector<float> my_rows(all.begin() + first * width, all.begin() + (first + mine) * width);
    std::vector<float> gathered;
    processes.gather(my_rows, gathered);
    std::vector<float> alone, summed;
    add_in_row_order(all, width, alone);
    add_in_row_order(gathered, width, summed);
    CHECK(summed == alone);
    // the same sum by a reduce-scatter of the columns and an allgather (what training does), also
    // when some process has no column (3 columns, 4 processes)
    std::vector<float> total;
    Processes::RowScratch scratch;
    processes.add_rows(my_rows, static_cast<std::size_t>(width), total, scratch);
    CHECK(total == alone);
    processes.add_rows(my_rows, static_cast<std::size_t>(width), total, scratch);  // again, in the same memory
    CHECK(total == alone);
    std::vector<float> narrow_all, narrow_mine;
    for (int64_t row = 0; row < shards; ++row)
        for (int64_t column = 0; column < 3; ++column) narrow_all.push_back(all[row * width + column]);
    narrow_mine.assign(narrow_all.begin() + first * 3, narrow_all.begin() + (first + mine) * 3);
    processes.add_rows(narrow_mine, 3, total, scratch);
    add_in_row_order(narrow_all, 3, summed);
    CHECK(total == summed);
    // the same rows added last to first: other bits somewhere
    std::vector<float> reversed;
    for (int64_t row = shards - 1; row >= 0; --row) {
        reversed.insert(reversed.end(), all.begin() + row * width, all.begin() + (row + 1) * width);
    }
    add_in_row_order(reversed, width, summed);
    CHECK(summed != alone);
#ifdef RELGRAD_WITH_MPI
    if (processes.count() == 4) {
        // MPI's own sum of the four numbers above, one a process: the order is Open MPI's choice
        // (by message size, process count and network), so it is shown, not checked
        int initialized = 0;
        MPI_Initialized(&initialized);
        REQUIRE(initialized);
        float value = four[static_cast<std::size_t>(processes.rank())], total = 0;
        MPI_Allreduce(&value, &total, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MESSAGE("MPI_Allreduce(MPI_SUM) of 1e8, 1, -1e8, 1 on 4 processes gave " << total << "; in shard order: 1");
    }
#endif
}
