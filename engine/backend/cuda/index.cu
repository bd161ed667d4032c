// The CUDA backend's index kernels (engine/ops/index.cpp). Reads (gather, index_select) take one
// thread per output element. scatter_add takes one thread per line along the indexed dim, which
// walks its line in order: several sources may add to one output element, and a single thread
// adding them in a fixed order keeps the sums deterministic without atomics. index_add (the
// backward of index_select and of an embedding, where a few lines walk thousands of indices)
// first sorts the positions by the row they add to, stably, then takes one thread per (row, line),
// which adds its row's sources in position order: parallel over rows, and deterministic.
// An index out of range is reported to the backend's error record and thrown on the host at its
// next copy from the device (cuda_backend.hpp).
#include "engine/backend/cuda/cuda_backend.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

Shape with_zero_at(Shape strides, int64_t dim) {
    strides[dim] = 0;
    return strides;
}

Shape with_one_at(Shape shape, int64_t dim) {
    shape[dim] = 1;
    return shape;
}

// out[e] = x[x_base(e) + index[e] * step] over the elements e of index (gather) or of out
// (index_select, where index is read at e's coordinate along dim)
template <class T>
__global__ void read_kernel(const T* x, Layout x_base, int64_t step, int64_t size, const int64_t* index,
                            Layout index_layout, T* out, Layout out_layout, int64_t n, ErrorReport error) {
    RELGRAD_FOR_EACH_INDEX(e, n) {
        const int64_t i = index[offset_of(index_layout, e)];
        if (i < 0 || i >= size) {
            report(error, i, size);
            continue;
        }
        out[offset_of(out_layout, e)] = x[offset_of(x_base, e) + i * step];
    }
}

// For each line l (the elements with every coordinate but dim fixed), in order along dim:
// out[out_base(l) + index[...] * step] += src[...], index and src read at line l's k-th element.
template <class T>
__global__ void add_kernel(T* out, Layout out_base, int64_t step, int64_t size, const int64_t* index,
                           Layout index_lines, int64_t index_step, const T* src, Layout src_lines, int64_t src_step,
                           int64_t length, int64_t lines, ErrorReport error) {
    RELGRAD_FOR_EACH_INDEX(l, lines) {
        const int64_t* line_index = index + offset_of(index_lines, l);
        const T* line_src = src + offset_of(src_lines, l);
        T* line_out = out + offset_of(out_base, l);
        for (int64_t k = 0; k < length; ++k) {
            const int64_t i = line_index[k * index_step];
            if (i < 0 || i >= size) {
                report(error, i, size);
                continue;
            }
            line_out[i * step] += line_src[k * src_step];
        }
    }
}

// --- index_add by sorted positions. With the index [n] along dim, row v = index[p] of out takes
// the sources at the positions p with index[p] = v, in increasing p. The positions are sorted by
// row, stably, in chunks of kIndexChunk positions (chunk c: positions [c C, (c + 1) C)):
//   rank:    rank[p] = #{q < p in p's chunk: index[q] = index[p]}, and counts[c, v] = #{p in chunk
//            c: index[p] = v}, written by the first such p (a block per chunk, its rows in shared
//            memory; no atomics)
//   before:  counts[c, v] becomes the count of v in the chunks before c, and totals[v] the count
//            of v in all (a thread per row)
//   starts:  starts[v] = totals[0] + ... + totals[v - 1], in place (one block)
//   place:   order[starts[v] + counts[c, v] + rank[p]] = p
//   sum:     out[v, l] += src[order[k], l] for k in [starts[v], starts[v + 1]), a thread per (v, l)
// The buffers hold (chunks + 1) size + 2 n + 1 int64s.
#ifdef RELGRAD_CUDA_EMULATION
constexpr unsigned kIndexChunk = 32;  // a fiber per thread: blocks of a warp
#else
constexpr unsigned kIndexChunk = 1024;
#endif

__global__ void rank_kernel(const int64_t* index, int64_t index_step, int64_t length, int64_t size, int64_t* counts,
                            int64_t* rank, ErrorReport error) {
    RELGRAD_SHARED(int64_t, rows, kIndexChunk);  // the chunk's rows; -1 past the end and for a bad index
    const int64_t chunk = blockIdx.x, p = chunk * kIndexChunk + threadIdx.x;
    int64_t row = -1;
    if (p < length) {
        row = index[p * index_step];
        if (row < 0 || row >= size) {
            report(error, row, size);
            row = -1;
        }
    }
    rows[threadIdx.x] = row;
    __syncthreads();
    if (row < 0) return;
    int64_t before = 0, count = 0;
    for (unsigned u = 0; u < kIndexChunk; ++u) {
        if (rows[u] == row) {
            before += u < threadIdx.x ? 1 : 0;
            ++count;
        }
    }
    rank[p] = before;
    if (before == 0) counts[chunk * size + row] = count;
}

__global__ void before_kernel(int64_t* counts, int64_t chunks, int64_t size, int64_t* totals) {
    RELGRAD_FOR_EACH_INDEX(v, size) {
        int64_t running = 0;
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t count = counts[c * size + v];
            counts[c * size + v] = running;
            running += count;
        }
        totals[v] = running;
    }
}

// totals[0, size) -> their exclusive prefix sums, and totals[size] = the sum of all: one block,
// each thread a run of rows
__global__ void starts_kernel(int64_t* totals, int64_t size) {
    RELGRAD_SHARED(int64_t, runs, kRowThreads);  // each thread's run's sum, then what comes before it
    const int64_t per_thread = (size + blockDim.x - 1) / blockDim.x, first = threadIdx.x * per_thread;
    const int64_t last = first + per_thread < size ? first + per_thread : size;
    int64_t sum = 0;
    for (int64_t v = first; v < last; ++v) sum += totals[v];
    runs[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t running = 0;
        for (unsigned t = 0; t < blockDim.x; ++t) {
            const int64_t run = runs[t];
            runs[t] = running;
            running += run;
        }
        totals[size] = running;
    }
    __syncthreads();
    int64_t running = runs[threadIdx.x];
    for (int64_t v = first; v < last; ++v) {
        const int64_t total = totals[v];
        totals[v] = running;
        running += total;
    }
}

__global__ void place_kernel(const int64_t* index, int64_t index_step, int64_t length, int64_t size,
                             const int64_t* starts, const int64_t* counts, const int64_t* rank, int64_t* order) {
    RELGRAD_FOR_EACH_INDEX(p, length) {
        const int64_t row = index[p * index_step];
        if (row >= 0 && row < size) order[starts[row] + counts[(p / kIndexChunk) * size + row] + rank[p]] = p;
    }
}

template <class T>
__global__ void sum_rows_kernel(T* out, Layout out_base, int64_t step, const T* src, Layout src_lines, int64_t src_step,
                                const int64_t* starts, const int64_t* order, int64_t size, int64_t lines) {
    RELGRAD_FOR_EACH_INDEX(e, size * lines) {
        const int64_t v = e / lines, l = e % lines;
        T* target = out + offset_of(out_base, l) + v * step;
        const T* line_src = src + offset_of(src_lines, l);
        T total = *target;
        for (int64_t k = starts[v]; k < starts[v + 1]; ++k) total += line_src[order[k] * src_step];
        *target = total;
    }
}

}  // namespace

void CudaBackend::do_gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t n = index.numel();
    const ErrorReport error = error_report("gather", BadInput::index, dim);
    dispatch_floating(x.dtype(), "gather", [&](auto tag) {
        using T = decltype(tag);
        launch("gather", read_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<T>(x),
               layout_of(index.shape(), with_zero_at(x.strides(), dim), "gather"), x.strides()[dim], x.shape()[dim],
               device_data<int64_t>(index), layout_of(index, "gather"), device_data<T>(out), layout_of(out, "gather"),
               n, error);
    });
}

void CudaBackend::do_index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t n = out.numel();
    Shape index_strides(out.dim(), 0);  // the index varies along dim only
    index_strides[dim] = index.strides()[0];
    const ErrorReport error = error_report("index_select", BadInput::index, dim);
    dispatch_floating(x.dtype(), "index_select", [&](auto tag) {
        using T = decltype(tag);
        launch("index_select", read_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<T>(x),
               layout_of(out.shape(), with_zero_at(x.strides(), dim), "index_select"), x.strides()[dim], x.shape()[dim],
               device_data<int64_t>(index), layout_of(out.shape(), index_strides, "index_select"), device_data<T>(out),
               layout_of(out, "index_select"), n, error);
    });
}

void CudaBackend::do_scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const Shape lines_shape = with_one_at(index.shape(), dim);
    const int64_t lines = shape_numel(lines_shape), length = index.shape()[dim];
    const ErrorReport error = error_report("scatter_add", BadInput::index, dim);
    dispatch_floating(out.dtype(), "scatter_add", [&](auto tag) {
        using T = decltype(tag);
        launch("scatter_add", add_kernel<T>, grid_for(lines, kElementThreads), kElementThreads, 0, device_data<T>(out),
               layout_of(lines_shape, with_zero_at(out.strides(), dim), "scatter_add"), out.strides()[dim],
               out.shape()[dim], device_data<int64_t>(index), layout_of(lines_shape, index.strides(), "scatter_add"),
               index.strides()[dim], device_data<T>(src), layout_of(lines_shape, src.strides(), "scatter_add"),
               src.strides()[dim], length, lines, error);
    });
}

void CudaBackend::do_index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const Shape lines_shape = with_one_at(src.shape(), dim);
    const int64_t lines = shape_numel(lines_shape), length = src.shape()[dim], size = out.shape()[dim];
    if (length == 0 || lines == 0) return;
    const int64_t chunks = (length + kIndexChunk - 1) / kIndexChunk;
    Tensor counts = empty({chunks, size}, DType::int64, Device::cuda);
    const Tensor starts = empty({size + 1}, DType::int64, Device::cuda);
    const Tensor rank = empty({length}, DType::int64, Device::cuda),
                 order = empty({length}, DType::int64, Device::cuda);
    const int64_t* rows = device_data<int64_t>(index);
    const int64_t index_step = index.strides()[0];
    int64_t* counts_data = device_data<int64_t>(counts);
    int64_t* starts_data = device_data<int64_t>(starts);
    const ErrorReport error = error_report("index_add", BadInput::index, dim);
    fill(counts, 0);
    launch("index_add", rank_kernel, dim3(static_cast<unsigned>(chunks)), kIndexChunk, 0, rows, index_step, length,
           size, counts_data, device_data<int64_t>(rank), error);
    launch("index_add", before_kernel, grid_for(size, kElementThreads), kElementThreads, 0, counts_data, chunks, size,
           starts_data);
    launch("index_add", starts_kernel, 1, kRowThreads, 0, starts_data, size);
    launch("index_add", place_kernel, grid_for(length, kElementThreads), kElementThreads, 0, rows, index_step, length,
           size, starts_data, counts_data, device_data<int64_t>(rank), device_data<int64_t>(order));
    dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
        using T = decltype(tag);
        launch("index_add", sum_rows_kernel<T>, grid_for(size * lines, kElementThreads), kElementThreads, 0,
               device_data<T>(out), layout_of(lines_shape, with_zero_at(out.strides(), dim), "index_add"),
               out.strides()[dim], device_data<T>(src), layout_of(lines_shape, src.strides(), "index_add"),
               src.strides()[dim], starts_data, device_data<int64_t>(order), size, lines);
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
