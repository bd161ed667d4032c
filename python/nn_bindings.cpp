// relgrad's Python module: relgrad.nn, the layers, masks and models of layers/.
//
// Every layer is built from keyword arguments with the C++ defaults, plus seed (its parameters are
// drawn from it) and dtype; calling a layer runs its forward. Child layers and parameters are
// attributes under the C++ names, which are also the names of named_parameters() and state_dict().
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "engine/autograd.hpp"
#include "layers/transformer.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

using Lengths = std::optional<std::vector<int64_t>>;
constexpr auto kChild = py::return_value_policy::reference_internal;

// Each row as long as the tensor when no lengths are given.
std::vector<int64_t> lengths_or_full(const Lengths& lengths, const Tensor& ids) {
    if (lengths) return *lengths;
    if (ids.dim() != 2) throw std::invalid_argument("ids must be [B, L], got " + shape_str(ids.shape()));
    return std::vector<int64_t>(ids.size(0), ids.size(1));
}

// seed and dtype, and for the Transformer blocks and models the options of TransformerOptions,
// from keyword arguments; an unknown keyword is a TypeError, as Python's own.
struct Built {
    Generator gen{0};
    DType dtype = DType::float32;
    TransformerOptions options;
    Init init() { return Init{gen, dtype}; }
};

Built built_from(const py::kwargs& kwargs, bool transformer_options) {
    Built built;
    TransformerOptions& o = built.options;
    std::optional<int64_t> k;
    for (const auto& [key_handle, value] : kwargs) {
        const std::string key = key_handle.cast<std::string>();
        if (key == "seed")
            built.gen = Generator(value.cast<uint64_t>());
        else if (key == "dtype")
            built.dtype = dtype_from(value);
        else if (!transformer_options)
            throw py::type_error("unexpected keyword argument '" + key + "'");
        else if (key == "dim")
            o.dim = value.cast<int64_t>();
        else if (key == "heads")
            o.heads = value.cast<int64_t>();
        else if (key == "ff_dim")
            o.ff_dim = value.cast<int64_t>();
        else if (key == "layers")
            o.layers = value.cast<int64_t>();
        else if (key == "dropout")
            o.dropout = value.cast<double>();
        else if (key == "position")
            o.position = parse_position_mode(value.cast<std::string>());
        else if (key == "k")
            k = value.cast<int64_t>();
        else if (key == "k_left")
            o.relative.k_left = value.cast<int64_t>();
        else if (key == "k_right")
            o.relative.k_right = value.cast<int64_t>();
        else if (key == "share_across_heads")
            o.relative.share_across_heads = value.cast<bool>();
        else if (key == "rank")
            o.relative.rank = value.cast<int64_t>();
        else if (key == "relative_values")
            o.relative.values = value.cast<bool>();
        else if (key == "relative_init_std")
            o.relative.init_std = value.cast<double>();
        else if (key == "impl")
            o.impl = parse_attention_impl(value.cast<std::string>());
        else if (key == "token_gate")
            o.token_gate = value.cast<bool>();
        else if (key == "max_len")
            o.max_len = o.relative.max_len = value.cast<int64_t>();
        else if (key == "checkpoint")
            o.checkpoint = value.cast<bool>();
        else
            throw py::type_error("unexpected keyword argument '" + key + "'");
    }
    if (k) {
        if (kwargs.contains("k_left") || kwargs.contains("k_right")) {
            throw std::invalid_argument("give k (both sides) or k_left and k_right, not both");
        }
        o.relative.k_left = o.relative.k_right = *k;
    }
    return built;
}

RelativeOptions relative_options(int64_t k, const std::optional<int64_t>& k_left, const std::optional<int64_t>& k_right,
                                 bool share_across_heads, int64_t max_len, int64_t rank, double init_std,
                                 bool values = true) {
    RelativeOptions options;
    options.k_left = k_left.value_or(k);
    options.k_right = k_right.value_or(k);
    options.share_across_heads = share_across_heads;
    options.max_len = max_len;
    options.rank = rank;
    options.init_std = init_std;
    options.values = values;
    return options;
}

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
    if (!missing.empty() || !unexpected.empty()) {
        throw std::invalid_argument("load_state_dict: " + (missing.empty() ? "" : "missing " + missing) +
                                    (missing.empty() || unexpected.empty() ? "" : "; ") +
                                    (unexpected.empty() ? "" : "unexpected " + unexpected));
    }
    // Convert every value first, so that a bad one leaves the module as it was.
    std::vector<Tensor> values;
    for (const auto& [name, parameter] : parameters) {
        py::object value = state[py::str(name)];
        Tensor tensor = py::isinstance<Tensor>(value)
                            ? value.cast<Tensor>().detach()
                            : tensor_from(value, py::cast(parameter.dtype()), false, py::none());
        if (tensor.shape() != parameter.shape()) {
            throw std::invalid_argument("load_state_dict: " + name + " has shape " + shape_str(tensor.shape()) +
                                        ", the parameter " + shape_str(parameter.shape()));
        }
        values.push_back(tensor);
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < values.size(); ++i) Tensor(parameters[i].second).copy_(values[i]);
}

template <class Layer>
using LayerClass = py::class_<Layer, Module>;

// Child layer and tensor attributes, on a layer class of any base.
template <class Layer, class... Bases, class Child>
void child(py::class_<Layer, Bases...>& layer, const char* name, Child Layer::*member) {
    layer.def_property_readonly(
        name, [member](Layer& self) -> Child& { return self.*member; }, kChild);
}
template <class Layer, class... Bases>
void tensor_attribute(py::class_<Layer, Bases...>& layer, const char* name, Tensor Layer::*member) {
    layer.def_property_readonly(name, [member](const Layer& self) { return tensor_or_none(self.*member); });
}

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
                for (DType dtype : {DType::float32, DType::float64}) {
                    if (where == dtype_name(dtype)) {
                        module.to(dtype);
                        return self;
                    }
                }
                module.to(parse_device(where));
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
                 Built b = built_from(kwargs, false);
                 return std::make_unique<Linear>(in_features, out_features, b.init(), bias);
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
                 Built b = built_from(kwargs, false);
                 return std::make_unique<Embedding>(num_embeddings, dim, b.init(), init_std);
             }),
             py::arg("num_embeddings"), py::arg("dim"), py::arg("init_std") = 0.02)
        .def("__call__", &Embedding::forward, py::arg("ids"));
    tensor_attribute(embedding_layer, "weight", &Embedding::weight);

    LayerClass<LayerNorm> layer_norm_layer(nn, "LayerNorm",
                                           "(x - mean) / sqrt(var + eps) * weight + bias, over the last dim");
    layer_norm_layer
        .def(py::init([](int64_t dim, double eps, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<LayerNorm>(dim, b.init(), eps);
             }),
             py::arg("dim"), py::arg("eps") = 1e-5)
        .def("__call__", &LayerNorm::forward, py::arg("x"));
    tensor_attribute(layer_norm_layer, "weight", &LayerNorm::weight);
    tensor_attribute(layer_norm_layer, "bias", &LayerNorm::bias);

    LayerClass<Dropout>(nn, "Dropout", "Zeroes each element with probability p in training mode")
        .def(py::init([](double p, uint64_t seed) { return std::make_unique<Dropout>(p, seed); }), py::arg("p"),
             py::arg("seed") = 0)
        .def("__call__", &Dropout::forward, py::arg("x"));

    LayerClass<FeedForward> feed_forward(nn, "FeedForward", "fc2(dropout(gelu(fc1(x)))), D -> hidden_dim -> D");
    feed_forward
        .def(py::init([](int64_t dim, int64_t hidden_dim, double dropout_p, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<FeedForward>(dim, hidden_dim, dropout_p, b.init());
             }),
             py::arg("dim"), py::arg("hidden_dim"), py::arg("dropout") = 0.0)
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
        .def(py::init([](int64_t max_len, int64_t dim, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<LearnedPositionalEmbedding>(max_len, dim, b.init());
             }),
             py::arg("max_len"), py::arg("dim"))
        .def("__call__", &LearnedPositionalEmbedding::forward, py::arg("x"), py::arg("offset") = 0);
    tensor_attribute(learned, "weight", &LearnedPositionalEmbedding::weight);

    LayerClass<RelativePositionEmbedding> relative(nn, "RelativePositionEmbedding",
                                                   "Shaw's table of K = k_left + k_right + 1 vectors, indexed by r(i, "
                                                   "j) = clip(j - i, -k_left, k_right) + k_left");
    relative
        .def(py::init([](int64_t head_dim, int64_t heads, int64_t k, const std::optional<int64_t>& k_left,
                         const std::optional<int64_t>& k_right, bool share_across_heads, int64_t max_len, int64_t rank,
                         double init_std, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<RelativePositionEmbedding>(
                     head_dim, heads, relative_options(k, k_left, k_right, share_across_heads, max_len, rank, init_std),
                     b.init());
             }),
             py::arg("head_dim"), py::arg("heads") = 1, py::arg("k") = 8, py::arg("k_left") = py::none(),
             py::arg("k_right") = py::none(), py::arg("share_across_heads") = true, py::arg("max_len") = 512,
             py::arg("rank") = 0, py::arg("init_std") = 0.02)
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
                if (key_len) throw std::invalid_argument("key_padding_mask: key_len goes with a list of lengths");
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

    // --- attention
    LayerClass<MultiHeadAttention> mha(nn, "MultiHeadAttention", "Scaled dot-product attention over H heads");
    mha.def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                Built b = built_from(kwargs, false);
                return std::make_unique<MultiHeadAttention>(dim, heads, b.init());
            }),
            py::arg("dim"), py::arg("heads"))
        .def(
            "__call__",
            [](MultiHeadAttention& layer, const Tensor& query, const std::optional<Tensor>& key_value,
               const std::optional<Tensor>& mask, int64_t query_offset) {
                return layer.forward(query, key_value.value_or(query), mask.value_or(Tensor()), query_offset);
            },
            py::arg("query"), py::arg("key_value") = py::none(), py::arg("mask") = py::none(),
            py::arg("query_offset") = 0, py::call_guard<py::gil_scoped_release>(),
            "query [B, Lq, D] attends to key_value [B, Lk, D] (itself when None)")
        .def_readwrite("causal", &MultiHeadAttention::causal)
        .def_readwrite("window", &MultiHeadAttention::window)
        .def_readonly("dim", &MultiHeadAttention::dim)
        .def_readonly("heads", &MultiHeadAttention::heads)
        .def_readonly("head_dim", &MultiHeadAttention::head_dim);
    tensor_attribute(mha, "last_weights", &MultiHeadAttention::last_weights);
    child(mha, "w_q", &MultiHeadAttention::w_q);
    child(mha, "w_k", &MultiHeadAttention::w_k);
    child(mha, "w_v", &MultiHeadAttention::w_v);
    child(mha, "w_o", &MultiHeadAttention::w_o);

    py::class_<RelativeMultiHeadAttention, MultiHeadAttention> relative_mha(
        nn, "RelativeMultiHeadAttention",
        "Attention with Shaw's key and value terms; impl: reference | bucketed | fused");
    relative_mha
        .def(py::init([](int64_t dim, int64_t heads, int64_t k, const std::optional<int64_t>& k_left,
                         const std::optional<int64_t>& k_right, bool share_across_heads, int64_t max_len, int64_t rank,
                         const std::string& impl, bool values, double init_std, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<RelativeMultiHeadAttention>(
                     dim, heads,
                     relative_options(k, k_left, k_right, share_across_heads, max_len, rank, init_std, values),
                     parse_attention_impl(impl), b.init());
             }),
             py::arg("dim"), py::arg("heads"), py::arg("k") = 8, py::arg("k_left") = py::none(),
             py::arg("k_right") = py::none(), py::arg("share_across_heads") = true, py::arg("max_len") = 512,
             py::arg("rank") = 0, py::arg("impl") = "bucketed", py::arg("values") = true, py::arg("init_std") = 0.02)
        .def_property(
            "impl",
            [](const RelativeMultiHeadAttention& layer) { return std::string(attention_impl_name(layer.impl)); },
            [](RelativeMultiHeadAttention& layer, const std::string& name) {
                layer.impl = parse_attention_impl(name);
            });
    relative_mha.def_readonly("value_term", &RelativeMultiHeadAttention::value_term,
                              "values=True: Shaw's value-side term too (rel_pos_emb_v a parameter)");
    child(relative_mha, "rel_pos_emb_k", &RelativeMultiHeadAttention::rel_pos_emb_k);
    child(relative_mha, "rel_pos_emb_v", &RelativeMultiHeadAttention::rel_pos_emb_v);

    py::class_<GatedPositionAttention, RelativeMultiHeadAttention> gated(
        nn, "GatedPositionAttention", "Relative and absolute position terms mixed per head by g = sigmoid(lambda)");
    gated
        .def(py::init([](int64_t dim, int64_t heads, int64_t k, const std::optional<int64_t>& k_left,
                         const std::optional<int64_t>& k_right, bool share_across_heads, int64_t max_len, int64_t rank,
                         const std::string& impl, bool token_gate, bool values, double init_std,
                         const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, false);
                 return std::make_unique<GatedPositionAttention>(
                     dim, heads,
                     relative_options(k, k_left, k_right, share_across_heads, max_len, rank, init_std, values),
                     parse_attention_impl(impl), token_gate, b.init());
             }),
             py::arg("dim"), py::arg("heads"), py::arg("k") = 8, py::arg("k_left") = py::none(),
             py::arg("k_right") = py::none(), py::arg("share_across_heads") = true, py::arg("max_len") = 512,
             py::arg("rank") = 0, py::arg("impl") = "bucketed", py::arg("token_gate") = false, py::arg("values") = true,
             py::arg("init_std") = 0.02)
        .def("gate_values", &GatedPositionAttention::gate_values, "g per head: 1 = relative, 0 = absolute")
        .def_property_readonly(
            "gate", [](const GatedPositionAttention& l) { return l.gate; }, "lambda [H]")
        .def_readonly("token_gate", &GatedPositionAttention::token_gate)
        .def_property_readonly(
            "w_gate", [](GatedPositionAttention& l) { return l.w_gate.get(); }, kChild);
    child(gated, "w_pq", &GatedPositionAttention::w_pq);
    child(gated, "w_pk", &GatedPositionAttention::w_pk);

    // --- Transformer blocks and models; keyword options as TransformerOptions (layers/transformer.hpp)
    LayerClass<EncoderLayer> encoder_layer(nn, "EncoderLayer", "x + attention(norm1(x)), then x + ff(norm2(x))");
    encoder_layer
        .def(py::init([](const py::kwargs& kwargs) {
            Built b = built_from(kwargs, true);
            return std::make_unique<EncoderLayer>(b.options, b.init());
        }))
        .def(
            "__call__",
            [](EncoderLayer& layer, const Tensor& x, const std::optional<Tensor>& mask, int64_t query_offset) {
                return layer.forward(x, mask.value_or(Tensor()), query_offset);
            },
            py::arg("x"), py::arg("mask") = py::none(), py::arg("query_offset") = 0,
            py::call_guard<py::gil_scoped_release>())
        .def_property_readonly(
            "self_attention", [](EncoderLayer& l) { return l.self_attention.get(); }, kChild);
    child(encoder_layer, "norm1", &EncoderLayer::norm1);
    child(encoder_layer, "norm2", &EncoderLayer::norm2);
    child(encoder_layer, "feed_forward", &EncoderLayer::feed_forward);

    LayerClass<DecoderLayer> decoder_layer(nn, "DecoderLayer", "causal self-attention, cross-attention, feed-forward");
    decoder_layer
        .def(py::init([](const py::kwargs& kwargs) {
            Built b = built_from(kwargs, true);
            return std::make_unique<DecoderLayer>(b.options, b.init());
        }))
        .def(
            "__call__",
            [](DecoderLayer& layer, const Tensor& x, const Tensor& memory, const std::optional<Tensor>& self_mask,
               const std::optional<Tensor>& memory_mask) {
                return layer.forward(x, memory, self_mask.value_or(Tensor()), memory_mask.value_or(Tensor()));
            },
            py::arg("x"), py::arg("memory"), py::arg("self_mask") = py::none(), py::arg("memory_mask") = py::none(),
            py::call_guard<py::gil_scoped_release>())
        .def_property_readonly(
            "self_attention", [](DecoderLayer& l) { return l.self_attention.get(); }, kChild);
    child(decoder_layer, "norm1", &DecoderLayer::norm1);
    child(decoder_layer, "norm2", &DecoderLayer::norm2);
    child(decoder_layer, "cross_attention", &DecoderLayer::cross_attention);
    child(decoder_layer, "norm3", &DecoderLayer::norm3);
    child(decoder_layer, "feed_forward", &DecoderLayer::feed_forward);

    LayerClass<TokenEmbedding> token_embedding(nn, "TokenEmbedding",
                                               "tokens(ids) sqrt(D) + absolute positions, dropout");
    token_embedding
        .def(py::init([](int64_t vocab, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, true);
                 return std::make_unique<TokenEmbedding>(vocab, b.options, b.init());
             }),
             py::arg("vocab"))
        .def("__call__", &TokenEmbedding::forward, py::arg("ids"), py::arg("offset") = 0);
    child(token_embedding, "tokens", &TokenEmbedding::tokens);

    // The encoder layers of an Encoder (or of a model's decoder stack), as the C++ holds them.
    auto layer_list = [](py::object self, const auto& layers) {
        py::list out;
        for (const auto& layer : layers) out.append(py::cast(layer.get(), kChild, self));
        return out;
    };
    LayerClass<Encoder> encoder(nn, "Encoder", "A stack of encoder layers with a final LayerNorm");
    encoder
        .def(py::init([](const py::kwargs& kwargs) {
            Built b = built_from(kwargs, true);
            return std::make_unique<Encoder>(b.options, b.init());
        }))
        .def(
            "__call__",
            [](Encoder& e, const Tensor& x, const std::optional<Tensor>& mask) {
                return e.forward(x, mask.value_or(Tensor()));
            },
            py::arg("x"), py::arg("mask") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly(
            "layers", [layer_list](py::object self) { return layer_list(self, self.cast<Encoder&>().layers); });
    child(encoder, "final_norm", &Encoder::final_norm);

    LayerClass<SequenceClassifier> classifier(nn, "SequenceClassifier", "ids [B, L] -> logits [B, classes]");
    classifier
        .def(py::init([](int64_t vocab, int64_t classes, const std::string& pooling, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, true);
                 if (pooling != "mean" && pooling != "first") {
                     throw std::invalid_argument("pooling '" + pooling + "': choose mean or first");
                 }
                 return std::make_unique<SequenceClassifier>(
                     vocab, classes, b.options, pooling == "mean" ? Pooling::mean : Pooling::first, b.init());
             }),
             py::arg("vocab"), py::arg("classes"), py::arg("pooling") = "mean")
        .def(
            "__call__",
            [](SequenceClassifier& model, const Tensor& ids, const Lengths& lengths) {
                return model.forward(ids, lengths_or_full(lengths, ids));
            },
            py::arg("ids"), py::arg("lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def("gates", &SequenceClassifier::gates, "g per layer and head of the gated attention layers");
    child(classifier, "embed", &SequenceClassifier::embed);
    child(classifier, "encoder", &SequenceClassifier::encoder);
    child(classifier, "classifier", &SequenceClassifier::classifier);

    LayerClass<CausalLanguageModel> language_model(nn, "CausalLanguageModel",
                                                   "ids [B, L] -> next-token logits [B, L, vocab]");
    language_model
        .def(py::init([](int64_t vocab, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, true);
                 return std::make_unique<CausalLanguageModel>(vocab, b.options, b.init());
             }),
             py::arg("vocab"))
        .def(
            "__call__",
            [](CausalLanguageModel& model, const Tensor& ids, const Lengths& lengths) {
                return model.forward(ids, lengths_or_full(lengths, ids));
            },
            py::arg("ids"), py::arg("lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def("greedy_decode", &CausalLanguageModel::greedy_decode, py::arg("prompt"), py::arg("eos"),
             py::arg("max_tokens"), py::call_guard<py::gil_scoped_release>(),
             "The most likely next token, one at a time with a key/value cache, until eos or max_tokens")
        .def("gates", &CausalLanguageModel::gates);
    child(language_model, "embed", &CausalLanguageModel::embed);
    child(language_model, "decoder", &CausalLanguageModel::decoder);
    child(language_model, "lm_head", &CausalLanguageModel::lm_head);

    LayerClass<EncoderDecoder> encoder_decoder(nn, "EncoderDecoder",
                                               "source [B, Ls], target input [B, Lt] -> logits [B, Lt, target_vocab]");
    encoder_decoder
        .def(py::init([](int64_t source_vocab, int64_t target_vocab, const py::kwargs& kwargs) {
                 Built b = built_from(kwargs, true);
                 return std::make_unique<EncoderDecoder>(source_vocab, target_vocab, b.options, b.init());
             }),
             py::arg("source_vocab"), py::arg("target_vocab"))
        .def(
            "__call__",
            [](EncoderDecoder& model, const Tensor& source, const Tensor& target, const Lengths& source_lengths,
               const Lengths& target_lengths) {
                return model.forward(source, lengths_or_full(source_lengths, source), target,
                                     lengths_or_full(target_lengths, target));
            },
            py::arg("source"), py::arg("target"), py::arg("source_lengths") = py::none(),
            py::arg("target_lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def(
            "encode",
            [](EncoderDecoder& model, const Tensor& source, const Lengths& source_lengths) {
                return model.encode(source, lengths_or_full(source_lengths, source));
            },
            py::arg("source"), py::arg("source_lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def(
            "greedy_decode",
            [](EncoderDecoder& model, const Tensor& source, int64_t bos, int64_t eos, int64_t max_steps,
               const Lengths& source_lengths) {
                return model.greedy_decode(source, lengths_or_full(source_lengths, source), bos, eos, max_steps);
            },
            py::arg("source"), py::arg("bos"), py::arg("eos"), py::arg("max_steps"),
            py::arg("source_lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def("gates", &EncoderDecoder::gates)
        .def_property_readonly("decoder_layers", [layer_list](py::object self) {
            return layer_list(self, self.cast<EncoderDecoder&>().decoder_layers);
        });
    child(encoder_decoder, "source_embed", &EncoderDecoder::source_embed);
    child(encoder_decoder, "target_embed", &EncoderDecoder::target_embed);
    child(encoder_decoder, "encoder", &EncoderDecoder::encoder);
    child(encoder_decoder, "decoder_norm", &EncoderDecoder::decoder_norm);
    child(encoder_decoder, "output", &EncoderDecoder::output);
}

}  // namespace relgrad::python
