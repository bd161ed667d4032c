// relgrad's Python module: the ops of engine/ops.hpp as relgrad.<op>, and the threads and memory
// they run with.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include <omp.h>

#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/profile.hpp"
#include "engine/system.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

void bind_ops(py::module_& m) {
    // the ops (engine/ops.hpp)
    m.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
    m.def("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
    m.def("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
    m.def("div", [](const Tensor& a, const Tensor& b) { return div(a, b); });
    m.def("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); });
    m.def("pow", [](const Tensor& a, double exponent) { return pow(a, exponent); });
    m.def("neg", [](const Tensor& x) { return neg(x); });
    m.def("exp", [](const Tensor& x) { return exp(x); });
    m.def("log", [](const Tensor& x) { return log(x); });
    m.def("sqrt", [](const Tensor& x) { return sqrt(x); });
    m.def("tanh", [](const Tensor& x) { return tanh(x); });
    m.def("sigmoid", [](const Tensor& x) { return sigmoid(x); });
    m.def("relu", [](const Tensor& x) { return relu(x); });
    m.def("gelu", [](const Tensor& x) { return gelu(x); });
    m.def(
        "clamp", [](const Tensor& x, double low, double high) { return clamp(x, low, high); }, py::arg("x"),
        py::arg("low"), py::arg("high"));
    m.def("where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); });
    m.def("masked_fill", [](const Tensor& x, const Tensor& mask, double value) { return masked_fill(x, mask, value); });
    m.def("sum_to", &sum_to, py::arg("gradient"), py::arg("shape"),
          "Sums a gradient over the dims that broadcasting added or stretched: the backward of a broadcast");
    m.def(
        "sum", [](const Tensor& t, const py::object& dim, bool keepdim) { return sum(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def(
        "mean", [](const Tensor& t, const py::object& dim, bool keepdim) { return mean(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def(
        "max", [](const Tensor& t, const py::object& dim, bool keepdim) { return max(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def("matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });
    m.def("concat", &concat, py::arg("tensors"), py::arg("dim"));
    m.def("stack", &stack, py::arg("tensors"), py::arg("dim"));
    m.def("gather", &gather, py::arg("x"), py::arg("dim"), py::arg("index"));
    m.def("scatter_add", &scatter_add, py::arg("x"), py::arg("dim"), py::arg("index"), py::arg("src"));
    m.def("index_select", &index_select, py::arg("x"), py::arg("dim"), py::arg("index"));
    m.def("embedding", &embedding, py::arg("weight"), py::arg("ids"));
    m.def("softmax", &softmax, py::arg("x"), py::arg("dim"));
    m.def("log_softmax", &log_softmax, py::arg("x"), py::arg("dim"));
    m.def("layer_norm", &layer_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps") = layer_norm_eps);
    m.def(
        "dropout",
        [](const Tensor& x, double p, bool training, uint64_t seed) {
            Generator gen(seed);
            return dropout(x, p, training, gen);
        },
        py::arg("x"), py::arg("p"), py::arg("training") = true, py::arg("seed") = 0);
    m.def(
        "dropout_add",
        [](const Tensor& residual, const Tensor& x, double p, bool training, uint64_t seed) {
            Generator gen(seed);
            return dropout_add(residual, x, p, training, gen);
        },
        py::arg("residual"), py::arg("x"), py::arg("p"), py::arg("training") = true, py::arg("seed") = 0,
        "residual + dropout(x, p) in one pass, the same mask as dropout(x, p, training, seed)");
    py::enum_<Reduction>(m, "Reduction").value("mean", Reduction::mean).value("sum", Reduction::sum);
    m.def("cross_entropy", &cross_entropy, py::arg("logits"), py::arg("target"), py::arg("ignore_index") = -100,
          py::arg("reduction") = Reduction::mean);
    m.def(
        "attention",
        [](const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
           const std::optional<double>& scale, const std::optional<Tensor>& table_k,
           const std::optional<Tensor>& table_v, const std::optional<Tensor>& index,
           const std::optional<Tensor>& bias) {
            py::gil_scoped_release release;
            const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
            return attention(q, k, v, mask.value_or(Tensor()), s,
                             RelativeTerms{table_k.value_or(Tensor()), table_v.value_or(Tensor()),
                                           index.value_or(Tensor()), bias.value_or(Tensor())});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("scale") = py::none(),
        py::arg("table_k") = py::none(), py::arg("table_v") = py::none(), py::arg("index") = py::none(),
        py::arg("bias") = py::none(),
        "Scaled dot-product attention with Shaw's relative terms and/or a score bias per bucket [H or 1, K] "
        "(added after the scale) in the bucketed form, one op (engine/ops.hpp)");
    m.def(
        "fused_attention",
        [](const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, bool causal,
           int64_t window, int64_t query_offset, const std::optional<double>& scale,
           const std::optional<Tensor>& table_k, const std::optional<Tensor>& table_v, int64_t k_left, int64_t k_right,
           const std::optional<Tensor>& distance_bias) {
            py::gil_scoped_release release;
            const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
            return fused_attention(q, k, v, AttentionPattern{mask.value_or(Tensor()), causal, window, query_offset}, s,
                                   ClippedRelativeTerms{table_k.value_or(Tensor()), table_v.value_or(Tensor()), k_left,
                                                        k_right, distance_bias.value_or(Tensor())});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("window") = -1, py::arg("query_offset") = 0, py::arg("scale") = py::none(),
        py::arg("table_k") = py::none(), py::arg("table_v") = py::none(), py::arg("k_left") = 0, py::arg("k_right") = 0,
        py::arg("distance_bias") = py::none(),
        "The same attention in memory linear in L: no [Lq, Lk] tensor is ever made (distance_bias: [H or 1, "
        "Lq + Lk - 1], entry j - i + Lq - 1 added after the scale)");
    m.def(
        "rope",
        [](const Tensor& x, int64_t first_position, double base) {
            py::gil_scoped_release release;
            return rope(x, first_position, base);
        },
        py::arg("x"), py::arg("first_position") = 0, py::arg("base") = rope_default_base,
        "RoPE: the pairs of x [..., L, Dh] rotated by their positions first_position.. (engine/ops.hpp)");

    m.def(
        "set_threads",
        [](int threads) {
            // the bounds of training.threads
            RELGRAD_CHECK(threads >= 1 && threads <= 1024, "set_threads: the thread count must be in [1, 1024], got ",
                          threads);
            set_thread_count(threads, "set_threads");
        },
        py::arg("threads"), "The threads the ops use from now on, as --threads (training sets training.threads)");
    m.def(
        "threads", [] { return omp_get_max_threads(); }, "The threads the ops use");
    m.def(
        "memory_stats",
        [](const std::string& device) {
            const MemoryStats stats = memory_stats(parse_device(device));
            py::dict result;
            result["live_bytes"] = stats.live_bytes;
            result["peak_live_bytes"] = stats.peak_live_bytes;
            result["cached_bytes"] = stats.cached_bytes;
            return result;
        },
        py::arg("device") = "cpu", "Bytes of tensor storage alive now and at most since reset_peak_memory()");
    m.def(
        "reset_peak_memory", [](const std::string& device) { reset_peak_memory(parse_device(device)); },
        py::arg("device") = "cpu");

    // with relgrad.profile() as p: ...; print(p): engine/profile.hpp's table of what ran inside
    struct PythonProfile {
        Profile profile;
        std::optional<double> machine_gflops;  // measured once, when the table is first asked for
    };
    auto table_of = [](PythonProfile& p) {
        if (!p.machine_gflops) p.machine_gflops = measure_gemm_gflops();
        return profile_table(p.profile, *p.machine_gflops);
    };
    py::class_<PythonProfile>(m, "Profile", "Where the time inside a `with relgrad.profile()` block went")
        .def("__enter__",
             [](PythonProfile& p) -> PythonProfile& {
                 start_profile();
                 return p;
             })
        .def("__exit__",
             [](PythonProfile& p, const py::object&, const py::object&, const py::object&) {
                 p.profile = stop_profile();
                 return false;
             })
        .def_property_readonly("seconds", [](const PythonProfile& p) { return p.profile.seconds; })
        .def_property_readonly(
            "rows",
            [](const PythonProfile& p) {
                py::list rows;
                for (const ProfileRow& row : p.profile.rows) {
                    py::dict entry;
                    entry["op"] = row.op;
                    entry["phase"] = name_of(phase_names, row.phase);
                    entry["calls"] = row.calls;
                    entry["seconds"] = row.seconds;
                    entry["gemm_flops"] = row.gemm_flops;
                    entry["gemm_seconds"] = row.gemm_seconds;
                    rows.append(entry);
                }
                return rows;
            },
            "One dict per (op, phase), the most time first")
        .def("table", table_of)
        .def("__str__", table_of);
    m.def(
        "profile", [] { return PythonProfile(); },
        "A context manager: `with relgrad.profile() as p:` times every op inside, forward and backward; "
        "print(p) shows the table");
}

}  // namespace relgrad::python
