// Indexing: gather, scatter_add, index_select, embedding.
#include "test_helpers.hpp"
#include "engine/backend/backend.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {
Tensor ids(const std::vector<double>& values, const Shape& shape) { return from_vector(values, shape, DType::int64); }
}  // namespace

TEST_CASE("gather reads and scatter_add accumulates at the indexed places") {
    const Tensor x = f64({10, 11, 12, 20, 21, 22}, {2, 3});
    check_values(gather(x, 1, ids({2, 0, 1, 1}, {2, 2})), {12, 10, 21, 21});
    check_values(gather(x, 0, ids({1, 0, 1}, {1, 3})), {20, 11, 22});
    const Tensor added =
        scatter_add(zeros({2, 3}, DType::float64), 1, ids({2, 2, 0, 1}, {2, 2}), f64({1, 2, 3, 4}, {2, 2}));
    check_values(added, {0, 0, 3, 3, 4, 0});  // a repeated index adds both values
}

TEST_CASE("index_select and embedding pick rows") {
    const Tensor table = f64({0, 1, 10, 11, 20, 21}, {3, 2});
    check_values(index_select(table, 0, ids({2, 0, 2}, {3})), {20, 21, 0, 1, 20, 21});
    check_values(index_select(table, 1, ids({1}, {1})), {1, 11, 21});
    const Tensor looked_up = embedding(table, ids({1, 2, 0, 1}, {2, 2}));
    CHECK(looked_up.shape() == Shape{2, 2, 2});
    check_values(looked_up, {10, 11, 20, 21, 0, 1, 10, 11});
}

TEST_CASE("bad indices are reported, not read") {
    const Tensor table = zeros({3, 2}, DType::float64);
    CHECK_THROWS_WITH_AS(embedding(table, ids({3}, {1})), "index_select: index 3 is out of range for dim 0 of size 3",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, ids({-1}, {1, 1})), "gather: index -1 is out of range for dim 1 of size 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, zeros({1, 1})), "gather: the index must be int64, got float32",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, ids({0, 0, 0, 0}, {4, 1})),
                         "gather: index of shape [4, 1] does not fit the input of shape [3, 2] outside dim 1",
                         std::invalid_argument);
    CHECK_THROWS_AS(scatter_add(table, 0, ids({0}, {1, 1}), zeros({1, 2}, DType::float64)), std::invalid_argument);
    CHECK_THROWS_WITH_AS(embedding(zeros({3}), ids({0}, {1})), "embedding: the weight must be [V, D], got shape [3]",
                         std::invalid_argument);
}

TEST_CASE("indexing gradients") {
    for (const char* op : {"gather", "scatter_add", "index_select", "embedding"}) gradcheck_op(op);
}

TEST_CASE("index_add (index_select's backward) on every device equals the CPU's, bitwise, repeats and all") {
    // Rows hit many times, over several of the CUDA kernel's sort chunks (32 positions in the
    // emulator), along dim 0 and dim 1, a strided source, rows never hit; each device adds a row's
    // sources in position order, as the CPU does, so float64 results are bitwise the CPU's.
    Generator gen(5);
    std::vector<double> rows;
    for (int64_t p = 0; p < 150; ++p) rows.push_back(p % 7 == 0 ? 2 : static_cast<double>((p * p) % 11));
    const Tensor index = ids(rows, {150});
    const Tensor base = randn({12, 3}, gen, DType::float64), src = randn({150, 3}, gen, DType::float64);
    const Tensor wide = randn({3, 150}, gen, DType::float64);  // its transpose: a strided [150, 3] source
    for (Device device : other_devices()) {
        for (const auto& [dim, source] : {std::pair<int64_t, Tensor>{0, src}, {0, wide.transpose(0, 1)}}) {
            Tensor on_cpu = base.clone(), on_device = base.to(device);
            backend_for(Device::cpu).index_add(on_cpu, dim, index, source);
            backend_for(device).index_add(on_device, dim, index.to(device), source.to(device));
            CHECK_MESSAGE(on_device.to(Device::cpu).to_vector() == on_cpu.to_vector(), device_name(device));
        }
        Tensor across_cpu = base.transpose(0, 1).clone(), across_device = across_cpu.to(device);  // dim 1: [3, 12]
        backend_for(Device::cpu).index_add(across_cpu, 1, index, wide);
        backend_for(device).index_add(across_device, 1, index.to(device), wide.to(device));
        CHECK_MESSAGE(across_device.to(Device::cpu).to_vector() == across_cpu.to_vector(), device_name(device));
    }
}

#ifdef RELGRAD_TEST_CUDA
TEST_CASE("on cuda, bad input a kernel finds is thrown at the next read from the device, the first found first") {
    // A kernel does not wait for the host: it stores what it found, and the next copy to the host
    // (a step's loss, to(Device::cpu), ...) throws what the CPU would have thrown at once.
    const Tensor table = f64({0, 1, 10, 11, 20, 21}, {3, 2}).to(Device::cuda);
    const Tensor picked = index_select(table, 0, ids({0, 3}, {2}).to(Device::cuda));
    const Tensor gathered = gather(table, 1, ids({-1}, {1, 1}).to(Device::cuda));  // found second: not the one thrown
    CHECK_THROWS_WITH_AS(picked.to(Device::cpu), "index_select: index 3 is out of range for dim 0 of size 3",
                         std::invalid_argument);
    // thrown once: the device goes on, and the next read throws only what is found after it
    check_values(index_select(table, 0, ids({2, 0}, {2}).to(Device::cuda)).to(Device::cpu), {20, 21, 0, 1});
    Tensor added = zeros({3, 2}, DType::float64, Device::cuda);  // index_add: index_select's backward
    backend_for(Device::cuda)
        .index_add(added, 0, ids({1, 5}, {2}).to(Device::cuda), ones({2, 2}, DType::float64, Device::cuda));
    CHECK_THROWS_WITH_AS(added.to(Device::cpu), "index_add: index 5 is out of range for dim 0 of size 3",
                         std::invalid_argument);
    const Tensor scattered =
        scatter_add(zeros({3, 2}, DType::float64, Device::cuda), 1, ids({0, 2}, {1, 2}).to(Device::cuda),
                    ones({1, 2}, DType::float64, Device::cuda));
    CHECK_THROWS_WITH_AS(scattered.to(Device::cpu), "scatter_add: index 2 is out of range for dim 1 of size 2",
                         std::invalid_argument);
    const Tensor converted = f64({1, NAN}, {2}).to(Device::cuda).to(DType::int64);
    CHECK_THROWS_WITH_AS(converted.to(Device::cpu), "conversion to int64: nan has no int64 value",
                         std::invalid_argument);
    // a read of another tensor throws it too: the report belongs to the device, not to the tensor
    const Tensor bad_again = gather(table, 0, ids({7}, {1, 1}).to(Device::cuda));
    CHECK_THROWS_WITH_AS(table.to(Device::cpu), "gather: index 7 is out of range for dim 0 of size 3",
                         std::invalid_argument);
    check_values(table.to(Device::cpu), {0, 1, 10, 11, 20, 21});
}
#endif
