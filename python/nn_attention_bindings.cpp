// relgrad.nn's attention layers: plain multi-head attention, Shaw's relative attention in its
// three forms, the gated mix of relative and absolute terms, and RoPE, ALiBi and T5's bias; the
// relative layers read their keyword options through the descriptions of layers/position.hpp.
#include <optional>

#include "layers/attention.hpp"
#include "python/nn_bindings.hpp"
#include "python/nn_options.hpp"

namespace relgrad::python {

namespace {

// The relative layers' keyword options: Shaw's, the form, and the gated layer's token gate.
struct RelativeLayerOptions {
    RelativeOptions relative;
    AttentionImpl impl = AttentionImpl::bucketed;
    bool token_gate = false;
};

// Their description; the gated layer's has the token gate too.
struct RelativeLayerDescription {
    bool gated;
    template <class Fields>
    void operator()(Fields& f, RelativeLayerOptions& o) const {
        relative_option_fields(f, o.relative);
        attention_form_field(f, o.impl);
        if (gated) token_gate_field(f, o.token_gate);
    }
};

// The relative family's keyword options: the form, and RoPE's or T5's own.
enum class FamilyLayer { rope, alibi, t5 };
struct FamilyLayerOptions {
    RelativeFamilyOptions family;
    AttentionImpl impl = AttentionImpl::bucketed;
    bool bidirectional = true;
};
struct FamilyLayerDescription {
    FamilyLayer layer;
    template <class Fields>
    void operator()(Fields& f, FamilyLayerOptions& o) const {
        if (layer == FamilyLayer::rope) rope_option_fields(f, o.family);
        if (layer == FamilyLayer::t5) {
            t5_option_fields(f, o.family);
            t5_direction_field(f, o.bidirectional, true);
        }
        attention_form_field(f, o.impl);
    }
};

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
        .def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 const FamilyLayerOptions o =
                     read_options<FamilyLayerOptions>(b.fields, FamilyLayerDescription{FamilyLayer::rope});
                 return std::make_unique<RotaryMultiHeadAttention>(dim, heads, o.family.rope_base, o.impl, b.init());
             }),
             py::arg("dim"), py::arg("heads"),
             options_doc<FamilyLayerOptions>("RoPE (Su et al. 2021)", FamilyLayerDescription{FamilyLayer::rope}))
        .def_readonly("base", &RotaryMultiHeadAttention::base);
    impl_property<RotaryMultiHeadAttention>(rotary);

    py::class_<AlibiAttention, MultiHeadAttention> alibi(nn, "AlibiAttention",
                                                         "ALiBi: the score bias -m_h |j - i|, no parameters");
    alibi
        .def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 const FamilyLayerOptions o =
                     read_options<FamilyLayerOptions>(b.fields, FamilyLayerDescription{FamilyLayer::alibi});
                 return std::make_unique<AlibiAttention>(dim, heads, o.impl, b.init());
             }),
             py::arg("dim"), py::arg("heads"),
             options_doc<FamilyLayerOptions>("ALiBi (Press et al. 2022)", FamilyLayerDescription{FamilyLayer::alibi}))
        .def_readonly("slopes", &AlibiAttention::slopes, "m_h per head");
    impl_property<AlibiAttention>(alibi);

    py::class_<T5BiasAttention, MultiHeadAttention> t5(
        nn, "T5BiasAttention", "T5's bias: a learned score bias per head and log-spaced bucket of j - i");
    t5.def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
               LayerKwargs b(kwargs);
               const FamilyLayerOptions o =
                   read_options<FamilyLayerOptions>(b.fields, FamilyLayerDescription{FamilyLayer::t5});
               return std::make_unique<T5BiasAttention>(dim, heads, o.family, o.bidirectional, o.impl, b.init());
           }),
           py::arg("dim"), py::arg("heads"),
           options_doc<FamilyLayerOptions>("T5's bias (Raffel et al. 2020)", FamilyLayerDescription{FamilyLayer::t5}))
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
    mha.def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                return std::make_unique<MultiHeadAttention>(dim, heads, seed_and_dtype(kwargs).init());
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
        "Attention with Shaw's key and value terms; attention=: reference | bucketed | fused");
    relative_mha
        .def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 const RelativeLayerOptions o =
                     read_options<RelativeLayerOptions>(b.fields, RelativeLayerDescription{false});
                 return std::make_unique<RelativeMultiHeadAttention>(dim, heads, o.relative, o.impl, b.init());
             }),
             py::arg("dim"), py::arg("heads"),
             options_doc<RelativeLayerOptions>("Shaw's relative attention", RelativeLayerDescription{false}))
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
        .def(py::init([](int64_t dim, int64_t heads, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 const RelativeLayerOptions o =
                     read_options<RelativeLayerOptions>(b.fields, RelativeLayerDescription{true});
                 return std::make_unique<GatedPositionAttention>(dim, heads, o.relative, o.impl, o.token_gate,
                                                                 b.init());
             }),
             py::arg("dim"), py::arg("heads"),
             options_doc<RelativeLayerOptions>("Relative and absolute terms mixed by a gate",
                                               RelativeLayerDescription{true}))
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
