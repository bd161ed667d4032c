// relgrad.nn's attention layers: plain multi-head attention, Shaw's relative attention in its
// three forms, the gated mix of relative and absolute terms, and RoPE, ALiBi and T5's bias. Each
// reads its sizes and keyword options through attention_option_fields (layers/transformer.hpp) and
// is built by make_attention, as a `relgrad layer` spec's attention types are.
#include <optional>

#include "layers/transformer.hpp"
#include "python/nn_bindings.hpp"
#include "python/nn_options.hpp"

namespace relgrad::python {

namespace {

// An attention class's options: dim, heads and what its position scheme reads
// (attention_option_fields in layers/transformer.hpp, as a layer spec reads them), T5's direction.
struct AttentionLayerOptions {
    TransformerOptions model;
    bool t5_bidirectional = true;
};
struct AttentionDescription {
    PositionMode position;
    template <class Fields>
    void operator()(Fields& f, AttentionLayerOptions& o) const {
        attention_option_fields(f, position, o.model, o.t5_bidirectional, /*bidirectional_default=*/true);
    }
};

// The constructor of the attention class of `position`: dim and heads, positional or keywords,
// range-checked with the other keyword options as a config's are; built by make_attention.
template <class Layer>
auto init_attention(PositionMode position) {
    return py::init([position](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
        const auto with_sizes = py::reinterpret_steal<py::kwargs>(PyDict_Copy(kwargs.ptr()));
        with_sizes["dim"] = dim;
        with_sizes["heads"] = heads;
        LayerKwargs b(with_sizes);
        AttentionLayerOptions o = read_options<AttentionLayerOptions>(b.fields, AttentionDescription{position});
        o.model.position = position;
        std::unique_ptr<MultiHeadAttention> layer = make_attention(o.model, b.init(), o.t5_bidirectional);
        return std::unique_ptr<Layer>(static_cast<Layer*>(layer.release()));
    });
}

const char* attention_doc(const std::string& summary, PositionMode position) {
    return options_doc<AttentionLayerOptions>(summary, AttentionDescription{position});
}

// A family layer's `impl` attribute, by name as the keyword takes it
template <class Layer, class Class>
void impl_property(Class& c) {
    c.def_property(
        "impl", [](const Layer& layer) { return std::string(attention_impl_name(layer.impl)); },
        [](Layer& layer, const std::string& name) { layer.impl = parse_attention_impl(name); });
}

// RoPE, ALiBi and T5's bias (after MultiHeadAttention, their base)
void bind_family(py::module_& nn) {
    py::class_<RotaryMultiHeadAttention, MultiHeadAttention> rotary(
        nn, "RotaryMultiHeadAttention", "RoPE: attention of q and k rotated by their positions");
    rotary
        .def(init_attention<RotaryMultiHeadAttention>(PositionMode::rope), py::arg("dim"), py::arg("heads"),
             attention_doc("RoPE (Su et al. 2021)", PositionMode::rope))
        .def_readonly("base", &RotaryMultiHeadAttention::base);
    impl_property<RotaryMultiHeadAttention>(rotary);

    py::class_<AlibiAttention, MultiHeadAttention> alibi(nn, "AlibiAttention",
                                                         "ALiBi: the score bias -m_h |j - i|, no parameters");
    alibi
        .def(init_attention<AlibiAttention>(PositionMode::alibi), py::arg("dim"), py::arg("heads"),
             attention_doc("ALiBi (Press et al. 2022)", PositionMode::alibi))
        .def_readonly("slopes", &AlibiAttention::slopes, "m_h per head");
    impl_property<AlibiAttention>(alibi);

    py::class_<T5BiasAttention, MultiHeadAttention> t5(
        nn, "T5BiasAttention", "T5's bias: a learned score bias per head and log-spaced bucket of j - i");
    t5.def(init_attention<T5BiasAttention>(PositionMode::t5), py::arg("dim"), py::arg("heads"),
           attention_doc("T5's bias (Raffel et al. 2020)", PositionMode::t5))
        .def_readonly("num_buckets", &T5BiasAttention::num_buckets)
        .def_readonly("max_distance", &T5BiasAttention::max_distance)
        .def_readwrite("bidirectional", &T5BiasAttention::bidirectional);
    impl_property<T5BiasAttention>(t5);
    t5.def_property_readonly(
        "relative_attention_bias", [](T5BiasAttention& l) { return &l.table(); }, kChild);
}

}  // namespace

void bind_attention(py::module_& nn) {
    LayerClass<MultiHeadAttention> mha(nn, "MultiHeadAttention", "Scaled dot-product attention over H heads");
    mha.def(init_attention<MultiHeadAttention>(PositionMode::none), py::arg("dim"), py::arg("heads"),
            attention_doc("Scaled dot-product attention over H heads", PositionMode::none))
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
        "Attention with Shaw's key and value terms; attention=: reference | bucketed | fused");
    relative_mha
        .def(init_attention<RelativeMultiHeadAttention>(PositionMode::relative), py::arg("dim"), py::arg("heads"),
             attention_doc("Shaw's relative attention", PositionMode::relative))
        .def_property(
            "impl",
            [](const RelativeMultiHeadAttention& layer) { return std::string(attention_impl_name(layer.impl)); },
            [](RelativeMultiHeadAttention& layer, const std::string& name) {
                layer.impl = parse_attention_impl(name);
            });
    relative_mha.def_readonly("value_term", &RelativeMultiHeadAttention::value_term,
                              "relative_values=True: Shaw's value-side term too (rel_pos_emb_v a parameter)");
    child(relative_mha, "rel_pos_emb_k", &RelativeMultiHeadAttention::rel_pos_emb_k);
    child(relative_mha, "rel_pos_emb_v", &RelativeMultiHeadAttention::rel_pos_emb_v);

    py::class_<GatedPositionAttention, RelativeMultiHeadAttention> gated(
        nn, "GatedPositionAttention", "Relative and absolute position terms mixed per head by g = sigmoid(lambda)");
    gated
        .def(init_attention<GatedPositionAttention>(PositionMode::gated), py::arg("dim"), py::arg("heads"),
             attention_doc("Relative and absolute terms mixed by a gate", PositionMode::gated))
        .def("gate_values", &GatedPositionAttention::gate_values, "g per head: 1 = relative, 0 = absolute")
        .def_property_readonly(
            "gate", [](const GatedPositionAttention& l) { return l.gate; }, "lambda [H]")
        .def_readonly("token_gate", &GatedPositionAttention::token_gate)
        .def_property_readonly(
            "w_gate", [](GatedPositionAttention& l) { return l.w_gate.get(); }, kChild);
    child(gated, "w_pq", &GatedPositionAttention::w_pq);
    child(gated, "w_pk", &GatedPositionAttention::w_pk);
    bind_family(nn);
}

}  // namespace relgrad::python
