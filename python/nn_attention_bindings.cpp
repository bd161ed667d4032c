// relgrad.nn's attention layers: plain multi-head attention, Shaw's relative attention in its
// three forms, and the gated mix of relative and absolute terms; the relative layers read their
// keyword options through RelativeOptions' description (layers/position.hpp).
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
}

}  // namespace relgrad::python
