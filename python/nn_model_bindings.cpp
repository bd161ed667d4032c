// relgrad.nn's Transformer blocks and models, built from keyword options read through
// TransformerOptions' description (layers/transformer.hpp): a block takes block_option_fields,
// everything else the whole stack's.
#include <optional>

#include "engine/errors.hpp"
#include "layers/transformer.hpp"
#include "python/nn_bindings.hpp"
#include "python/nn_options.hpp"

namespace relgrad::python {

namespace {

using Lengths = std::optional<std::vector<int64_t>>;

// Each row as long as the tensor when no lengths are given.
std::vector<int64_t> lengths_or_full(const Lengths& lengths, const Tensor& ids) {
    if (lengths) return *lengths;
    RELGRAD_CHECK(ids.dim() == 2, "ids must be [B, L], got ", shape_str(ids.shape()));
    return std::vector<int64_t>(ids.size(0), ids.size(1));
}

enum class Scope { block, stack };  // what a block takes, or a whole stack (with the two extras)

// The options a block or a stack takes, as their descriptions have them.
struct TransformerDescription {
    Scope scope;
    template <class Fields>
    void operator()(Fields& f, TransformerOptions& o) const {
        if (scope == Scope::block) return block_option_fields(f, o);
        transformer_option_fields(f, o);
        gradient_checkpointing_field(f, o);
        max_positions_field(f, o);
    }
};

// The constructor of a layer or model built from its arguments, then TransformerOptions read from
// keywords, then the Init: Model(args..., options, init).
template <class Model, class... Args>
auto init_with_options(Scope scope) {
    return py::init([scope](Args... args, const py::kwargs& kwargs) {
        LayerKwargs b(kwargs);
        const auto options = read_options<TransformerOptions>(b.fields, TransformerDescription{scope});
        return std::make_unique<Model>(args..., options, b.init());
    });
}

const char* transformer_doc(const std::string& summary, Scope scope) {
    return options_doc<TransformerOptions>(summary, TransformerDescription{scope});
}

// A block's constructor from keyword options, and its .options, the same for both blocks.
template <class Block>
void bind_block_options(LayerClass<Block>& block, const char* summary) {
    block.def(init_with_options<Block>(Scope::block), transformer_doc(summary, Scope::block))
        .def_property_readonly(
            "options",
            [](const Block& layer) {
                DictFields fields;
                TransformerOptions options = layer.options;
                TransformerDescription{Scope::block}(fields, options);
                return fields.dict;
            },
            "the options it was built with, every default filled in");
}

}  // namespace

void bind_models(py::module_& nn) {
    LayerClass<EncoderLayer> encoder_layer(nn, "EncoderLayer", "x + attention(norm1(x)), then x + ff(norm2(x))");
    bind_block_options(encoder_layer, "x + attention(norm1(x)), then x + ff(norm2(x))");
    encoder_layer
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
    bind_block_options(decoder_layer, "causal self-attention, cross-attention, feed-forward");
    decoder_layer
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
        .def(init_with_options<TokenEmbedding, int64_t>(Scope::stack), py::arg("vocab"),
             transformer_doc("tokens(ids) sqrt(D) + absolute positions, dropout", Scope::stack))
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
        .def(init_with_options<Encoder>(Scope::stack),
             transformer_doc("A stack of encoder layers with a final LayerNorm", Scope::stack))
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
        .def(py::init([](int64_t vocab, int64_t classes, const py::kwargs& kwargs) {
                 LayerKwargs b(kwargs);
                 Pooling pooling = Pooling::mean;
                 b.fields.named("pooling", pooling, pooling_names, Pooling::mean);  // as a config's model.pooling
                 const auto options = read_options<TransformerOptions>(b.fields, TransformerDescription{Scope::stack});
                 return std::make_unique<SequenceClassifier>(vocab, classes, options, pooling, b.init());
             }),
             py::arg("vocab"), py::arg("classes"),
             transformer_doc("ids [B, L] -> logits [B, classes]; pooling: \"mean\" (the default) or \"first\"",
                             Scope::stack))
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
        .def(init_with_options<CausalLanguageModel, int64_t>(Scope::stack), py::arg("vocab"),
             transformer_doc("ids [B, L] -> next-token logits [B, L, vocab]", Scope::stack))
        .def(
            "__call__",
            [](CausalLanguageModel& model, const Tensor& ids, const Lengths& lengths) {
                return model.forward(ids, lengths_or_full(lengths, ids));
            },
            py::arg("ids"), py::arg("lengths") = py::none(), py::call_guard<py::gil_scoped_release>())
        .def(
            "greedy_decode",
            [](CausalLanguageModel& model, const std::vector<int64_t>& prompt, int64_t eos, int64_t max_tokens) {
                return model.greedy_decode(prompt, eos, max_tokens);
            },
            py::arg("prompt"), py::arg("eos"), py::arg("max_tokens"), py::call_guard<py::gil_scoped_release>(),
            "The most likely next token, one at a time with a key/value cache, until eos or max_tokens")
        .def("gates", &CausalLanguageModel::gates);
    child(language_model, "embed", &CausalLanguageModel::embed);
    child(language_model, "decoder", &CausalLanguageModel::decoder);
    child(language_model, "lm_head", &CausalLanguageModel::lm_head);

    LayerClass<EncoderDecoder> encoder_decoder(nn, "EncoderDecoder",
                                               "source [B, Ls], target input [B, Lt] -> logits [B, Lt, target_vocab]");
    encoder_decoder
        .def(init_with_options<EncoderDecoder, int64_t, int64_t>(Scope::stack), py::arg("source_vocab"),
             py::arg("target_vocab"),
             transformer_doc("source [B, Ls], target input [B, Lt] -> logits [B, Lt, target_vocab]", Scope::stack))
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
