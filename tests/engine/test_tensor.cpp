// The Tensor: storage, strides, views without copies, dtypes, factories.
#include "test_helpers.hpp"
#include "engine/backend/backend.hpp"

#include <limits>

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("a new tensor is contiguous with row-major strides") {
    const Tensor t = zeros({2, 3, 4});
    CHECK(t.shape() == Shape{2, 3, 4});
    CHECK(t.strides() == Shape{12, 4, 1});
    CHECK(t.numel() == 24);
    CHECK(t.dim() == 3);
    CHECK(t.size(-1) == 4);
    CHECK(t.is_contiguous());
    CHECK(t.dtype() == DType::float32);
    CHECK(t.device() == Device::cpu);
    CHECK_THROWS_WITH_AS(t.size(3), "size: dim 3 is out of range for a tensor of rank 3", std::invalid_argument);
}

TEST_CASE("views share storage and see writes through the base") {
    Tensor base = f64({0, 1, 2, 3, 4, 5}, {2, 3});
    const Tensor t = base.transpose(0, 1);
    CHECK((t.storage() == base.storage()));
    CHECK(t.shape() == Shape{3, 2});
    CHECK(t.strides() == Shape{1, 3});
    CHECK_FALSE(t.is_contiguous());
    check_values(t, {0, 3, 1, 4, 2, 5});

    const Tensor row = base.narrow(0, 1, 1);
    CHECK((row.storage() == base.storage()));
    CHECK(row.offset() == 3);
    const Tensor column = base.slice(1, 0, 3, 2);
    check_values(column, {0, 2, 3, 5});
    const Tensor wide = base.narrow(1, 1, 1).expand({2, 4});
    CHECK(wide.strides() == Shape{3, 0});
    check_values(wide, {1, 1, 1, 1, 4, 4, 4, 4});

    base.data<double>()[4] = 40;  // visible through every view
    check_values(t, {0, 3, 1, 40, 2, 5});
    check_values(row, {3, 40, 5});
}

TEST_CASE("contiguous copies only when needed; reshape of a view copies") {
    const Tensor base = arange(6, DType::float64).view({2, 3});
    CHECK((base.contiguous().storage() == base.storage()));
    const Tensor t = base.transpose(0, 1).contiguous();
    CHECK(t.is_contiguous());
    CHECK((t.storage() != base.storage()));
    check_values(t, {0, 3, 1, 4, 2, 5});
    check_values(base.transpose(0, 1).reshape({6}), {0, 3, 1, 4, 2, 5});
    CHECK(base.reshape({3, -1}).shape() == Shape{3, 2});
    CHECK_THROWS_WITH_AS(base.transpose(0, 1).view({6}),
                         "view: the tensor of shape [3, 2] is not contiguous; use reshape()", std::invalid_argument);
    CHECK_THROWS_WITH_AS(base.view({4, -1}), "view: cannot view a tensor of shape [2, 3] (6 elements) as [4, -1]",
                         std::invalid_argument);
}

TEST_CASE("dtypes: conversion, item, bad requests") {
    const Tensor t = from_vector({1.5, -2.25, 3}, {3}, DType::float64);
    const Tensor f = t.to(DType::float32);
    CHECK(f.dtype() == DType::float32);
    check_values(f, {1.5, -2.25, 3});
    check_values(t.to(DType::int64), {1, -2, 3});
    check_values(t.to(DType::boolean), {1, 1, 1});
    CHECK((t.to(DType::float64).storage() == t.storage()));  // same dtype: no copy
    CHECK(scalar(2.5, DType::float64).item() == 2.5);
    CHECK_THROWS_WITH_AS(t.item(), "item: the tensor has 3 elements (shape [3]), expected 1", std::invalid_argument);
    CHECK_THROWS_AS(t.data<float>(), std::logic_error);
    CHECK_THROWS_AS(zeros({2}, DType::int64).requires_grad_(true), std::invalid_argument);
    CHECK_THROWS_AS(zeros({-1}), std::invalid_argument);
    CHECK(std::string(dtype_name(DType::boolean)) == "bool");
}

TEST_CASE("detach and clone") {
    Tensor x = f64({1, 2}, {2}).requires_grad_(true);
    const Tensor y = x * x;
    const Tensor d = y.detach();
    CHECK((d.storage() == y.storage()));
    CHECK_FALSE(d.requires_grad());
    CHECK(d.is_leaf());
    const Tensor c = x.clone();
    CHECK((c.storage() != x.storage()));
    CHECK(c.requires_grad());  // clone is recorded: gradients flow through it
}

// Random123's known answers for philox4x32 10 (its kat_vectors file): counter, key, result.
TEST_CASE("Philox 4x32-10 gives the published known answers; a generator's stream is its blocks in turn") {
    struct Known {
        PhiloxBlock counter;
        uint32_t k0, k1;
        PhiloxBlock result;
    };
    const uint32_t all = 0xffffffff;
    const Known known[] = {
        {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
        {{{all, all, all, all}}, all, all, {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
        {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
         0xa4093822,
         0x299f31d0,
         {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
    };
    for (const Known& k : known) {
        const PhiloxBlock got = philox4x32_10(k.counter, k.k0, k.k1);
        for (int w = 0; w < 4; ++w) CHECK(got.word[w] == k.result.word[w]);
    }
    // block i of seed s: counter (i, i >> 32, 0, 0), key (s, s >> 32)
    const uint64_t seed = 0x0123456789abcdefULL, index = 0x100000002ULL;
    const PhiloxBlock block = philox_block(seed, index), direct = philox4x32_10({{2, 1, 0, 0}}, 0x89abcdef, 0x01234567);
    for (int w = 0; w < 4; ++w) CHECK(block.word[w] == direct.word[w]);

    Generator gen(seed);
    CHECK(gen.take_blocks(5) == 0);
    CHECK(gen.offset() == 5);
    const Generator copy = gen;
    const PhiloxBlock fifth = philox_block(seed, 5);
    CHECK(gen.next_u64() == (uint64_t{fifth.word[0]} | uint64_t{fifth.word[1]} << 32));
    CHECK(gen.offset() == 6);
    Generator again = copy;  // a copy draws what the original drew
    CHECK(again.next_u64() == (uint64_t{fifth.word[0]} | uint64_t{fifth.word[1]} << 32));
}

TEST_CASE("a generator gives the same numbers for the same seed") {
    Generator a(42), b(42), c(43);
    const Tensor ta = randn({100}, a, DType::float64), tb = randn({100}, b, DType::float64);
    CHECK(ta.to_vector() == tb.to_vector());
    CHECK(ta.to_vector() != randn({100}, c, DType::float64).to_vector());
    const double m = mean(ta).item();
    CHECK(std::fabs(m) < 0.3);
    for (double u : rand({1000}, a, DType::float64).to_vector()) CHECK((u >= 0 && u < 1));
}

TEST_CASE("views are differentiable") {
    for (const char* op : {"transpose", "permute", "reshape", "slice", "narrow", "expand", "squeeze"}) {
        gradcheck_op(op);
    }
}

TEST_CASE("dtype conversion and clone pass gradients back in the source dtype") {
    Tensor x = from_vector({1, -2}, {2}, DType::float32).requires_grad_(true);
    sum(x.to(DType::float64) * 3.0 + x.clone().to(DType::float64)).backward();
    CHECK(x.grad().dtype() == DType::float32);
    check_values(x.grad(), {4, 4});
    // in float64 the same function passes a gradient check
    const GradcheckResult result = gradcheck(
        [](const std::vector<Tensor>& in) {
            return in[0].clone().to(DType::float64) * in[0].transpose(0, 1).contiguous();
        },
        {f64({1, 2, 3, 4}, {2, 2}).requires_grad_(true)});
    CHECK_MESSAGE(result.passed, result.report);
}

TEST_CASE("sizes are validated: negative, overflowing, empty dims") {
    CHECK_THROWS_WITH_AS(zeros({(int64_t{1} << 61) + 1}, DType::float64),
                         "shape [2305843009213693953] has too many elements", std::invalid_argument);
    CHECK_THROWS_AS(zeros({4}).view({int64_t{4611686018427387905}, 4}), std::invalid_argument);
    CHECK_THROWS_WITH_AS(arange(-1), "arange: negative length -1", std::invalid_argument);
    CHECK_THROWS_WITH_AS(ones({1}).expand({-3, 1}), "expand: cannot expand shape [1] to [-3, 1]",
                         std::invalid_argument);
    CHECK(ones({2, 1}).expand({3, -1, 4}).shape() == Shape{3, 2, 4});  // -1 keeps a dim
    CHECK(zeros({4}).slice(0, 1, 3, std::numeric_limits<int64_t>::max()).shape() == Shape{1});
    CHECK_THROWS_AS(zeros({4}).narrow(0, 2, std::numeric_limits<int64_t>::max()), std::invalid_argument);
    const Tensor empty_rows = zeros({3, 0});
    CHECK(empty_rows.is_contiguous());
    CHECK(empty_rows.reshape({0}).shape() == Shape{0});
    CHECK(stack({empty_rows, empty_rows}, 0).shape() == Shape{2, 3, 0});
    CHECK_THROWS_AS(Tensor().zero_grad(), std::logic_error);
    CHECK_THROWS_WITH_AS(from_vector({NAN}, {1}, DType::int64), "from_vector: nan has no int64 value",
                         std::invalid_argument);
    CHECK_THROWS_AS(f64({1e30}, {1}).to(DType::int64), std::invalid_argument);
    // an integer result carries no gradient
    Tensor x = f64({1.5, 2.5}, {2}).requires_grad_(true);
    CHECK_FALSE(x.to(DType::int64).requires_grad());
}

TEST_CASE("memory stats count live storage and its peak, not the spare blocks") {
    reset_peak_memory();
    const MemoryStats before = memory_stats();
    {
        const Tensor big = empty({1 << 20}, DType::float32);  // 4 MiB: a cached size once freed
        const Tensor view = big.narrow(0, 0, 10);             // a view costs nothing
        CHECK(memory_stats().live_bytes == before.live_bytes + (4 << 20));
    }
    const MemoryStats after = memory_stats();
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.peak_live_bytes == before.live_bytes + (4 << 20));
    CHECK(after.cached_bytes >= (4 << 20));
    reset_peak_memory();
    CHECK(memory_stats().peak_live_bytes == after.live_bytes);
    // a freed block serves any request of its size class: 1,000,000 and 1,040,000 bytes both take
    // a block of 2^20 (classes 2^19, 1.25 2^19, ..., 1.75 2^19, 2^20), 1,100,000 one of 1.25 2^20
    const int64_t cached_before = memory_stats().cached_bytes;
    { const Tensor first = empty({250000}, DType::float32); }
    CHECK(memory_stats().cached_bytes - cached_before >= (1 << 20));
    const int64_t cached_with_it = memory_stats().cached_bytes;
    {
        const Tensor same_class = empty({260000}, DType::float32);
        CHECK(memory_stats().cached_bytes == cached_with_it - (1 << 20));  // the same block again
        CHECK(memory_stats().live_bytes == before.live_bytes + 1040000);   // what the tensor asked for
    }
    {
        const Tensor next_class = empty({275000}, DType::float32);
        CHECK(memory_stats().cached_bytes == cached_with_it);  // nothing taken from the cache
    }
}

namespace {
// Device memory for the allocator's own test: blocks counted, never touched.
int raw_allocations = 0, raw_frees = 0;
void* counted_allocate(std::size_t) { return reinterpret_cast<void*>(uintptr_t{4096} * ++raw_allocations); }
void counted_free(void*) { ++raw_frees; }
}  // namespace

TEST_CASE("the caching allocator keeps freed blocks up to its limit, the biggest given back first") {
    const std::size_t three_gib = std::size_t{3} << 30;  // a size class of its own (1.5 2^31)
    {
        CachingAllocator host(counted_allocate, counted_free);  // 1 GiB: a 3 GiB block goes back
        host.deallocate(host.allocate(three_gib), three_gib);
        CHECK(raw_frees == 1);
        host.deallocate(host.allocate(three_gib), three_gib);
        CHECK(raw_allocations == 2);  // asked for again
        CHECK(host.stats().cached_bytes == 0);
    }
    raw_allocations = raw_frees = 0;
    {
        // a GPU's: no limit, the block is kept and served again
        CachingAllocator gpu(counted_allocate, counted_free, std::numeric_limits<std::size_t>::max());
        for (int step = 0; step < 3; ++step) gpu.deallocate(gpu.allocate(three_gib), three_gib);
        CHECK(raw_allocations == 1);
        CHECK(raw_frees == 0);
        CHECK(gpu.stats().cached_bytes == static_cast<int64_t>(three_gib));
    }
    CHECK(raw_frees == 1);  // the cache is given back with the allocator
    raw_allocations = raw_frees = 0;
    {
        CachingAllocator small(counted_allocate, counted_free, 4096);
        void* a = small.allocate(1024);
        void* b = small.allocate(4096);
        small.deallocate(a, 1024);
        small.deallocate(b, 4096);  // 5120 cached bytes: the 4096-byte block goes
        CHECK(raw_frees == 1);
        CHECK(small.stats().cached_bytes == 1024);
    }
}

TEST_CASE("a tensor knows its device; only explicit copies cross to the host") {
    const Device device = Device::guarded_cpu;
    const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64, device);
    CHECK(x.device() == device);
    // the host API refuses the device's memory; copies give its values
    CHECK_THROWS_WITH_AS(x.data<double>(),
                         "data<T>: the tensor is on the guarded_cpu device, which the host cannot read; copy it with "
                         "to(Device::cpu) first",
                         std::logic_error);
    CHECK(x.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
    CHECK(x.transpose(0, 1).to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
    CHECK(x.narrow(0, 0, 1).narrow(1, 2, 1).item() == 3);
    const Tensor host = x.transpose(0, 1).to(Device::cpu);
    CHECK(host.device() == Device::cpu);
    CHECK(host.data<double>()[1] == 4);
    // factories take a device and *_like keep it, as every op's result does
    for (const Tensor& t : {zeros_like(x), ones_like(x), empty_like(x), full({2}, 7, DType::int64, device),
                            arange(3, DType::float32, device), exp(x), sum(x, {0}), x.to(DType::float32),
                            matmul(x, x.transpose(0, 1)), x.contiguous(), x.transpose(0, 1).clone()}) {
        CHECK(t.device() == device);
    }
    // copy_: in place, across devices and dtypes, into a strided destination
    Tensor target = zeros({3, 2}, DType::float32);
    target.copy_(x.transpose(0, 1));
    CHECK(target.to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
    Tensor on_device = zeros({2, 3}, DType::float64, device);
    on_device.transpose(0, 1).copy_(from_vector({6, 5, 4, 3, 2, 1}, {3, 2}, DType::float32));
    CHECK(on_device.to_vector() == std::vector<double>{6, 4, 2, 5, 3, 1});
    CHECK_THROWS_AS(on_device.copy_(zeros({3})), std::invalid_argument);
    // a source that overlaps the destination is read before it is overwritten
    Tensor row = arange(8, DType::float64).reshape({2, 4});
    row.narrow(1, 1, 3).copy_(row.narrow(1, 0, 3));
    CHECK(row.to_vector() == std::vector<double>{0, 0, 1, 2, 4, 4, 5, 6});
    CHECK_THROWS_WITH_AS(zeros({3}).expand({2, 3}).copy_(ones({2, 3})),
                         "copy_: the destination [2, 3] is an expanded view, whose elements share memory",
                         std::invalid_argument);
    Tensor leaf = zeros({2}, DType::float64, device).requires_grad_(true);
    CHECK_THROWS_WITH_AS(leaf.copy_(ones({2}, DType::float64)),
                         "copy_: the tensor requires a gradient; copy into it under a NoGradGuard",
                         std::invalid_argument);
}

TEST_CASE("sizes computed from a shape never overflow") {
    // no element, but strides of 2^65: refused, not wrapped around
    CHECK_THROWS_WITH_AS(empty({0, int64_t{1} << 32, int64_t{1} << 32, 2}),
                         "shape [0, 4294967296, 4294967296, 2] is too large: its strides overflow int64",
                         std::invalid_argument);
    CHECK(empty({0, int64_t{1} << 31, 4}).strides() == Shape{int64_t{1} << 33, 4, 1});
    CHECK_THROWS_AS(zeros({2, 2}).view({0, int64_t{1} << 62, 8}), std::invalid_argument);
}

TEST_CASE("an op refuses operands on different devices, naming both") {
    const Tensor a = ones({2, 3}), b = ones({3}, DType::float32, Device::guarded_cpu);
    CHECK_THROWS_WITH_AS(add(a, b), "add: operands on different devices: cpu [2, 3] and guarded_cpu [3]",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(matmul(b, a.transpose(0, 1)),
                         "matmul: operands on different devices: guarded_cpu [3] and cpu [3, 2]",
                         std::invalid_argument);
    CHECK_THROWS_AS(gather(a, 1, zeros({2, 1}, DType::int64, Device::guarded_cpu)), std::invalid_argument);
    CHECK_THROWS_AS(concat({a, b.reshape({1, 3})}, 0), std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_device("tpu"), "unknown device 'tpu' (expected cpu, guarded_cpu or cuda)",
                         std::invalid_argument);
#ifdef RELGRAD_TEST_CUDA
    CHECK_THROWS_WITH_AS(add(a, ones({2, 3}, DType::float32, Device::cuda)),
                         "add: operands on different devices: cpu [2, 3] and cuda [2, 3]", std::invalid_argument);
#endif
}

TEST_CASE("the guarded device's kernels refuse an operand of another device") {
    // what an op that forgot a device check would hand a GPU kernel
    Tensor out = empty({3}, DType::float32, Device::guarded_cpu);
    CHECK_THROWS_WITH_AS(backend_for(Device::guarded_cpu).copy(ones({3}), out),
                         "copy: an operand on the cpu device reached the guarded_cpu kernels", std::logic_error);
    CHECK_THROWS_AS(
        scatter_add(zeros({2, 3}), 1, zeros({2, 1}, DType::int64), ones({2, 1}, DType::float32, Device::guarded_cpu)),
        std::invalid_argument);
}

TEST_CASE("to(device) is differentiable: the gradient goes back to the source device") {
    const Tensor x = from_vector({1, 2, 3}, {3}, DType::float64).requires_grad_(true);
    const Tensor y = mul(x.to(Device::guarded_cpu), x.to(Device::guarded_cpu));
    sum(y).backward();
    CHECK(x.grad().device() == Device::cpu);
    CHECK(x.grad().to_vector() == std::vector<double>{2, 4, 6});
}

TEST_CASE("each device counts its own memory") {
    reset_peak_memory(Device::guarded_cpu);
    const MemoryStats cpu_before = memory_stats(Device::cpu), before = memory_stats(Device::guarded_cpu);
    {
        const Tensor t = empty({1 << 20}, DType::float32, Device::guarded_cpu);
        CHECK(memory_stats(Device::guarded_cpu).live_bytes == before.live_bytes + (4 << 20));
        CHECK(memory_stats(Device::cpu).live_bytes == cpu_before.live_bytes);
    }
    CHECK(memory_stats(Device::guarded_cpu).live_bytes == before.live_bytes);
    CHECK(memory_stats(Device::guarded_cpu).peak_live_bytes == before.live_bytes + (4 << 20));
}
