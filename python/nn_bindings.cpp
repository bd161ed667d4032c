// relgrad's Python module: relgrad.nn, the layers, masks and models of layers/ (nn_bindings.hpp
// says which file binds which). This one: Module, the basic layers, positions and masks.
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/numpy.h>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "layers/attention.hpp"
#include "python/nn_bindings.hpp"
#include "python/nn_options.hpp"

namespace relgrad::python {

namespace {

py::dict state_dict(const Module& module) {
    py::dict state;
    for (const auto& [name, parameter] : module.named_parameters()) {
        state[py::str(name)] = to_numpy(parameter.detach().to(Device::cpu).clone());
    }
    return state;
}

// Copies each array into the parameter of its name; every name must match, and every shape.
void load_state_dict(Module& module, const py::dict& state) {
    const auto parameters = module.named_parameters();
    std::set<std::string> expected, given;
    for (const auto& [name, parameter] : parameters) expected.insert(name);
    for (const auto& [key, value] : state) given.insert(py::str(key).cast<std::string>());
    std::string missing, unexpected;
    for (const std::string& name : expected) {
        if (!given.count(name)) missing += (missing.empty() ? "" : ", ") + name;
    }
    for (const std::string& name : given) {
        if (!expected.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
    }
    RELGRAD_CHECK(
        missing.empty() && unexpected.empty(), "load_state_dict: ", missing.empty() ? "" : "missing " + missing,
        missing.empty() || unexpected.empty() ? "" : "; ", unexpected.empty() ? "" : "unexpected " + unexpected);
    // Convert every value first, so that a bad one leaves the module as it was.
    std::vector<Tensor> values;
    for (const auto& [name, parameter] : parameters) {
        py::object value = state[py::str(name)];
        Tensor tensor = py::isinstance<Tensor>(value)
                            ? value.cast<Tensor>().detach()
                            : tensor_from(value, py::cast(parameter.dtype()), false, py::none());
        RELGRAD_CHECK(tensor.shape() == parameter.shape(), "load_state_dict: ", name, " has shape ",
                      shape_str(tensor.shape()), ", the parameter ", shape_str(parameter.shape()));
        values.push_back(tensor);
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < values.size(); ++i) Tensor(parameters[i].second).copy_(values[i]);
}

// RelativePositionEmbedding's keyword options: Shaw's, as their description has them
constexpr auto describe_relative = [](auto& fields, RelativeOptions& o) { relative_option_fields(fields, o); };

}  // namespace

void bind_nn(py::module_& m) {
    py::module_ nn = m.def_submodule("nn", "The layers, masks and models (layers/)");

    py::class_<Module>(nn, "Module", "The base of every layer: named parameters and child layers")
        .def("named_parameters", &Module::named_parameters, "(name, parameter) pairs, with PyTorch-style dotted names")
        .def("parameters", &Module::parameters)
        .def("parameter_count", &Module::parameter_count)
        .def(
            "train",
            [](py::object self, bool mode) {
                self.cast<Module&>().train(mode);
                return self;
            },
            py::arg("mode") = true)
        .def("eval",
             [](py::object self) {
                 self.cast<Module&>().eval();
                 return self;
             })
        .def_property_readonly("training", &Module::is_training)
        .def("zero_grad", &Module::zero_grad)
        .def("reseed", &Module::reseed, py::arg("seed"), "Restart every dropout stream from seed")
        .def(
            "to",
            [](py::object self, const std::string& where) {
                Module& module = self.cast<Module&>();
                if (const auto dtype = value_named(floating_dtype_names, where)) {
                    module.to(*dtype);
                } else if (const auto device = value_named(device_names, where)) {
                    module.to(*device);
                } else {
                    RELGRAD_CHECK(false, "Module.to: '", where, "' is neither a dtype (",
                                  names_text(names_of(floating_dtype_names)), ") nor a device (",
                                  names_text(names_of(device_names)), ")");
                }
                return self;
            },
            py::arg("dtype_or_device"), "Converts the parameters ('float64') or moves them ('guarded_cpu')")
        .def_property_readonly("device", [](const Module& module) { return std::string(device_name(module.device())); })
        .def("state_dict", &state_dict,
             "{name: NumPy array} copies of the parameters, under the named_parameters() names")
        .def("load_state_dict", &load_state_dict, py::arg("state"),
             "Copies arrays (or tensors) into the parameters of the same names and shapes")
        .def("save", &Module::save, py::arg("dir"), "<dir>/<name>.npy per parameter and manifest.json")
        .def("load", &Module::load, py::arg("dir"))
        .def("__repr__", [](const py::object& self) {
            return py::str(self.get_type().attr("__name__")).cast<std::string>() + "(" +
                   std::to_string(self.cast<const Module&>().parameter_count()) + " parameters)";
        });

    // --- basic layers
    LayerClass<Linear> linear(nn, "Linear", "y = x W^T + b, W [out, in], b [out]");
    linear
        .def(py::init([](int64_t in_features, int64_t out_features, bool bias, const py::kwargs& kwargs) {
                 return std::make_unique<Linear>(in_features, out_features, seed_and_dtype(kwargs).init(), bias);
             }),
             py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true)
        .def("__call__", &Linear::forward, py::arg("x"))
        .def_readonly("in_features", &Linear::in_features)
        .def_readonly("out_features", &Linear::out_features);
    tensor_attribute(linear, "weight", &Linear::weight);
    tensor_attribute(linear, "bias", &Linear::bias);

    LayerClass<Embedding> embedding_layer(nn, "Embedding", "y = weight[ids], weight [V, D]");
    embedding_layer
        .def(py::init([](int64_t num_embeddings, int64_t dim, double init_std, const py::kwargs& kwargs) {
                 return std::make_unique<Embedding>(num_embeddings, dim, seed_and_dtype(kwargs).init(), init_std);
             }),
             py::arg("num_embeddings"), py::arg("dim"), py::arg("init_std") = 0.02)
        .def("__call__", &Embedding::forward, py::arg("ids"));
    tensor_attribute(embedding_layer, "weight", &Embedding::weight);

    LayerClass<LayerNorm> layer_norm_layer(nn, "LayerNorm",
                                           "(x - mean) / sqrt(var + eps) * weight + bias, over the last dim");
    layer_norm_layer
        .def(py::init([](int64_t dim, double eps, const py::kwargs& kwargs) {
                 return std::make_unique<LayerNorm>(dim, seed_and_dtype(kwargs).init(), eps);
             }),
             py::arg("dim"), py::arg("eps") = layer_norm_eps)
        .def("__call__", &LayerNorm::forward, py::arg("x"));
    tensor_attribute(layer_norm_layer, "weight", &LayerNorm::weight);
    tensor_attribute(layer_norm_layer, "bias", &LayerNorm::bias);

    LayerClass<Dropout>(nn, "Dropout", "Zeroes each element with probability p in training mode")
        .def(py::init([](double p, uint64_t seed) { return std::make_unique<Dropout>(p, seed); }), py::arg("p"),
             py::arg("seed") = 0)
        .def("__call__", &Dropout::forward, py::arg("x"));

    LayerClass<FeedForward> feed_forward(nn, "FeedForward", "fc2(dropout(gelu(fc1(x)))), D -> ff_dim -> D");
    feed_forward
        .def(py::init([](int64_t dim, int64_t ff_dim, double dropout_p, const py::kwargs& kwargs) {
                 return std::make_unique<FeedForward>(dim, ff_dim, dropout_p, seed_and_dtype(kwargs).init());
             }),
             py::arg("dim"), py::arg("ff_dim"), py::arg("dropout") = 0.0)
        .def("__call__", &FeedForward::forward, py::arg("x"));
    child(feed_forward, "fc1", &FeedForward::fc1);
    child(feed_forward, "fc2", &FeedForward::fc2);

    // --- positions
    LayerClass<SinusoidalPositionalEncoding>(nn, "SinusoidalPositionalEncoding",
                                             "PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same)")
        .def(py::init<int64_t>(), py::arg("dim"))
        .def(
            "encoding",
            [](const SinusoidalPositionalEncoding& pe, int64_t length, const py::object& dtype,
               const std::string& device) { return pe.encoding(length, dtype_from(dtype), parse_device(device)); },
            py::arg("length"), py::arg("dtype") = "float32", py::arg("device") = "cpu",
            "PE for positions 0..length-1: [L, D]")
        .def("__call__", &SinusoidalPositionalEncoding::forward, py::arg("x"), py::arg("offset") = 0)
        .def_readonly("dim", &SinusoidalPositionalEncoding::dim);

    LayerClass<LearnedPositionalEmbedding> learned(nn, "LearnedPositionalEmbedding", "x + weight[offset : offset + L]");
    learned
        .def(py::init([](int64_t max_positions, int64_t dim, const py::kwargs& kwargs) {
                 return std::make_unique<LearnedPositionalEmbedding>(max_positions, dim, seed_and_dtype(kwargs).init());
             }),
             py::arg("max_positions"), py::arg("dim"))
        .def("__call__", &LearnedPositionalEmbedding::forward, py::arg("x"), py::arg("offset") = 0);
    tensor_attribute(learned, "weight", &LearnedPositionalEmbedding::weight);

    LayerClass<RelativePositionEmbedding> relative(nn, "RelativePositionEmbedding",
                                                   "Shaw's table of K = k_left + k_right + 1 vectors, indexed by r(i, "
                                                   "j) = clip(j - i, -k_left, k_right) + k_left");
    relative
        .def(py::init([](int64_t head_dim, int64_t heads, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 const auto options = read_options<RelativeOptions>(b.fields, describe_relative);
                 return std::make_unique<RelativePositionEmbedding>(head_dim, heads, options, b.init());
             }),
             py::arg("head_dim"), py::arg("heads") = 1,
             options_doc<RelativeOptions>("Shaw's table E", describe_relative))
        .def("index", &RelativePositionEmbedding::index, py::arg("query_len"), py::arg("key_len"),
             py::arg("query_offset") = 0, "r(i, j): int64 [Lq, Lk]")
        .def("table", &RelativePositionEmbedding::table, "[H or 1, K, Dh]")
        .def("lookup", &RelativePositionEmbedding::lookup, py::arg("query_len"), py::arg("key_len"),
             py::arg("query_offset") = 0, "E[r(i, j)]: [H or 1, Lq, Lk, Dh]")
        .def("full_weight", &RelativePositionEmbedding::full_weight)
        .def_property_readonly("buckets", &RelativePositionEmbedding::buckets)
        .def_readonly("k_left", &RelativePositionEmbedding::k_left)
        .def_readonly("k_right", &RelativePositionEmbedding::k_right)
        .def_readonly("head_dim", &RelativePositionEmbedding::head_dim)
        .def_readonly("heads", &RelativePositionEmbedding::heads);
    tensor_attribute(relative, "weight", &RelativePositionEmbedding::weight);
    tensor_attribute(relative, "weight_a", &RelativePositionEmbedding::weight_a);
    tensor_attribute(relative, "weight_b", &RelativePositionEmbedding::weight_b);

    // --- masks: bool, True = may attend, broadcastable to [B, H, Lq, Lk]
    nn.def(
        "key_padding_mask",
        [](const py::object& lengths, const std::optional<int64_t>& key_len) {
            if (py::isinstance<Tensor>(lengths)) {
                RELGRAD_CHECK(!key_len, "key_padding_mask: key_len goes with a list of lengths");
                return key_padding_mask(lengths.cast<Tensor>());
            }
            const auto values = lengths.cast<std::vector<int64_t>>();
            int64_t longest = 0;
            for (int64_t length : values) longest = std::max(longest, length);
            return key_padding_mask(values, key_len.value_or(longest));
        },
        py::arg("lengths"), py::arg("key_len") = py::none(),
        "Keys at positions >= lengths[b] are padding: [B, 1, 1, Lk]; or from a [B, Lk] tensor, non-zero = a token");
    nn.def(
        "causal_mask",
        [](int64_t query_len, const std::optional<int64_t>& key_len, int64_t query_offset) {
            return causal_mask(query_len, key_len.value_or(query_len), query_offset);
        },
        py::arg("query_len"), py::arg("key_len") = py::none(), py::arg("query_offset") = 0,
        "Query i sees keys j <= query_offset + i: [Lq, Lk]");
    nn.def(
        "local_window_mask",
        [](int64_t query_len, const std::optional<int64_t>& key_len, int64_t window, int64_t query_offset) {
            return local_window_mask(query_len, key_len.value_or(query_len), window, query_offset);
        },
        py::arg("query_len"), py::arg("key_len") = py::none(), py::arg("window") = 1, py::arg("query_offset") = 0,
        "Query i sees keys with |j - (query_offset + i)| <= window: [Lq, Lk]");
    nn.def(
        "combine_masks",
        [](const std::optional<Tensor>& a, const std::optional<Tensor>& b) {
            return tensor_or_none(combine_masks(a.value_or(Tensor()), b.value_or(Tensor())));
        },
        py::arg("a"), py::arg("b"), "Attend only where both allow (None allows everything)");
    nn.def(
        "pattern_mask",
        [](int64_t query_len, int64_t key_len, const std::optional<Tensor>& mask, bool causal, int64_t window,
           int64_t query_offset) {
            return tensor_or_none(pattern_mask(AttentionPattern{mask.value_or(Tensor()), causal, window, query_offset},
                                               query_len, key_len));
        },
        py::arg("query_len"), py::arg("key_len"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("window") = -1, py::arg("query_offset") = 0,
        "The mask a fused attention's rules stand for (None when nothing is hidden)");

    nn.def("alibi_slopes", &alibi_slopes, py::arg("heads"), "ALiBi's slope m_h of each head (Press et al. 2022)");
    nn.def("t5_bucket", &t5_bucket, py::arg("distance"), py::arg("bidirectional") = true,
           py::arg("num_buckets") = t5_default_buckets, py::arg("max_distance") = t5_default_max_distance,
           "T5's bucket of the distance j - i (Raffel et al. 2020)");

    bind_attention(nn);
    bind_models(nn);
}

}  // namespace relgrad::python
