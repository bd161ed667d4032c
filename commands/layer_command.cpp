#include "commands/layer_command.hpp"

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "engine/npy.hpp"
#include "engine/ops.hpp"
#include "engine/system.hpp"
#include "layers/transformer.hpp"
#include "train/json_reader.hpp"
#include "train/option_fields.hpp"
#include "train/run_directory.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every size of a spec that no options description bounds (in_features, out_features, dim and
// heads of the plain layers, max_positions) is at most 2^20, and no parameter may have more than
// 2^28 elements (1 GiB in float32): checked on the sizes read, before anything is allocated, so
// that the error names the key.
constexpr int64_t kMostSize = int64_t{1} << 20;
constexpr int64_t kMostElements = int64_t{1} << 28;

// A spec is read with a JsonReader (errors name the file and the key's JSON path, unknown keys
// are errors) and the options descriptions of layers/ through JsonFields.
class Spec : public JsonFields {
public:
    Spec(const json& document, const std::string& path) : JsonFields(reader_), reader_(document, "", path) {}

    int64_t size(const char* key) { return reader_.integer(key, 1, kMostSize); }
    bool flag(const char* key, bool fallback) { return reader_.flag(key, fallback); }
    using JsonFields::flag;
    // a parameter [rows, columns], the sizes given by `key` (the one reported) and `other`
    void require_parameter(const char* key, int64_t rows, const char* other, int64_t columns) {
        if (rows * columns > kMostElements) {  // both at most 2^20: no overflow
            reader_.fail(key, std::string("a size that keeps each parameter within 2^28 elements: [") + key + ", " +
                                  other + "] = [" + std::to_string(rows) + ", " + std::to_string(columns) +
                                  "] would have " + std::to_string(rows * columns));
        }
    }
    JsonReader& reader() { return reader_; }

private:
    JsonReader reader_;
};

// A built layer and how to run it on x (and the attention mask, for attention layers).
struct LayerRun {
    std::unique_ptr<Module> module;
    std::function<Tensor(const Tensor& x, const Tensor& mask)> forward;
    int64_t model_dim = -1;  // x must be [B, L, model_dim]; -1: any shape ending in in_dim
    int64_t in_dim = -1;
    bool takes_mask = false;
    bool causal = false;
    DType dtype = DType::float32;
};

template <class Layer>
LayerRun run_of(std::unique_ptr<Layer> layer, int64_t model_dim, int64_t in_dim) {
    LayerRun run;
    Layer* raw = layer.get();
    run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
    run.module = std::move(layer);
    run.model_dim = model_dim;
    run.in_dim = in_dim;
    return run;
}

LayerRun build_layer(Spec& spec, Generator& gen) {
    JsonReader& r = spec.reader();
    const std::string type = r.text("type");
    DType dtype = DType::float32;
    spec.named("dtype", dtype, floating_dtype_names, DType::float32);
    const Init init{gen, dtype};
    LayerRun run;
    const bool family = type == "rope_attention" || type == "alibi_attention" || type == "t5_attention";
    if (type == "attention" || type == "relative_attention" || type == "gated_attention" || family) {
        const int64_t dim = spec.size("dim"), heads = spec.size("heads");
        spec.check(dim % heads == 0, "heads", "a divisor of dim = " + std::to_string(dim));
        run.causal = spec.flag("causal", false);
        // W_q .. W_o are [D, D]; the tables [K, D] at most and the low-rank factors [rank, D] stay
        // within 2^28 elements when they do, as the description bounds K and rank by 8193
        spec.require_parameter("dim", dim, "dim", dim);
        std::unique_ptr<MultiHeadAttention> attention;
        if (type == "attention") {
            attention = std::make_unique<MultiHeadAttention>(dim, heads, init);
        } else if (family) {
            RelativeFamilyOptions options;
            if (type == "rope_attention") rope_option_fields(spec, options);
            if (type == "t5_attention") t5_option_fields(spec, options);
            bool bidirectional = true;
            if (type == "t5_attention") t5_direction_field(spec, bidirectional, !run.causal);
            AttentionImpl impl = AttentionImpl::bucketed;
            attention_form_field(spec, impl);
            if (type == "rope_attention") {
                spec.check((dim / heads) % 2 == 0, "heads", "such that the head dim dim / heads is even (RoPE)");
                attention = std::make_unique<RotaryMultiHeadAttention>(dim, heads, options.rope_base, impl, init);
            } else if (type == "alibi_attention") {
                attention = std::make_unique<AlibiAttention>(dim, heads, impl, init);
            } else {
                attention = std::make_unique<T5BiasAttention>(dim, heads, options, bidirectional, impl, init);
            }
        } else {
            RelativeOptions relative;
            relative_option_fields(spec, relative);
            AttentionImpl impl = AttentionImpl::bucketed;
            attention_form_field(spec, impl);
            if (type == "relative_attention") {
                attention = std::make_unique<RelativeMultiHeadAttention>(dim, heads, relative, impl, init);
            } else {
                spec.check(impl != AttentionImpl::fused, "attention", "reference or bucketed (no fused gated form)");
                bool token_gate = false;
                token_gate_field(spec, token_gate);
                attention = std::make_unique<GatedPositionAttention>(dim, heads, relative, impl, token_gate, init);
            }
        }
        MultiHeadAttention* raw = attention.get();
        run.forward = [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, x, mask); };
        run.module = std::move(attention);
        run.model_dim = dim;
        run.takes_mask = true;
    } else if (type == "sinusoidal") {
        const int64_t dim = spec.size("dim");
        run = run_of(std::make_unique<SinusoidalPositionalEncoding>(dim), dim, -1);
    } else if (type == "learned_positions") {
        const int64_t max_positions = spec.size("max_positions"), dim = spec.size("dim");
        spec.require_parameter("dim", dim, "max_positions", max_positions);
        run = run_of(std::make_unique<LearnedPositionalEmbedding>(max_positions, dim, init), dim, -1);
    } else if (type == "linear") {
        const int64_t in = spec.size("in_features"), out = spec.size("out_features");
        spec.require_parameter("out_features", out, "in_features", in);
        run = run_of(std::make_unique<Linear>(in, out, init, spec.flag("bias", true)), -1, in);
    } else if (type == "layer_norm") {
        const int64_t dim = spec.size("dim");
        const double eps = r.number("eps", 0, 1, layer_norm_eps, true);
        run = run_of(std::make_unique<LayerNorm>(dim, init, eps), -1, dim);
    } else if (type == "feed_forward") {
        const int64_t dim = spec.size("dim"), ff_dim = spec.size("ff_dim");
        spec.require_parameter("ff_dim", ff_dim, "dim", dim);
        run = run_of(std::make_unique<FeedForward>(dim, ff_dim, 0.0, init), -1, dim);
    } else if (type == "encoder_layer") {
        TransformerOptions o;
        block_option_fields(spec, o);  // layers/transformer.hpp
        spec.check(o.position != PositionMode::sinusoidal && o.position != PositionMode::learned, "position",
                   "none, relative, gated, rope, alibi or t5 (sinusoidal and learned positions are added to the "
                   "embeddings, outside the layer)");
        spec.require_parameter("ff_dim", o.ff_dim, "dim", o.dim);  // [D, D] and the tables are within it
        run.causal = spec.flag("causal", false);
        auto layer = std::make_unique<EncoderLayer>(o, init);
        EncoderLayer* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, mask); };
        run.module = std::move(layer);
        run.model_dim = o.dim;
        run.takes_mask = true;
    } else {
        r.fail("type",
               "a layer type: attention, relative_attention, gated_attention, rope_attention, alibi_attention, "
               "t5_attention, sinusoidal, learned_positions, linear, layer_norm, feed_forward or encoder_layer");
    }
    run.dtype = dtype;
    run.module->eval();
    return run;
}

Tensor load_floating(const fs::path& path, DType dtype) { return load_npy_floats(path.string()).to(dtype); }

std::string shape_pattern(const Shape& shape) {  // [B, L, 8] with -1 shown as a letter
    std::string out = "[";
    const char* letters[] = {"B", "L"};
    for (std::size_t i = 0; i < shape.size(); ++i) {
        out += (i ? ", " : "") +
               (shape[i] < 0 ? std::string(letters[std::min<std::size_t>(i, 1)]) : std::to_string(shape[i]));
    }
    return out + "]";
}

// mask.npy: non-zero = attend; [B, L] key padding, [L, L] or [B, L, L] attention masks.
Tensor load_mask(const fs::path& path, int64_t B, int64_t L, const std::string& mask_type) {
    Tensor raw = load_npy(path.string());
    const Tensor keep = raw.to(DType::boolean);
    const Shape& s = keep.shape();
    const bool padding_shape = s == Shape{B, L}, square = s == Shape{L, L};
    if (padding_shape && square && mask_type.empty()) {
        throw std::invalid_argument(path.string() + ": shape [" + std::to_string(B) + ", " + std::to_string(L) +
                                    "] could be key padding [B, L] or an attention mask [L, L]; set \"mask_type\" to "
                                    "\"key_padding\" or \"attention\" in the spec");
    }
    if (padding_shape && mask_type != "attention") return key_padding_mask(keep);
    if (square && mask_type != "key_padding") return keep;
    if (s == Shape{B, L, L} && mask_type != "key_padding") return keep.unsqueeze(1);
    // what the mask may be, as far as "mask_type" allows
    const std::string padding = "[B, L] = " + shape_str({B, L}) + " (key padding)";
    const std::string attention =
        "[L, L] = " + shape_str({L, L}) + " or [B, L, L] = " + shape_str({B, L, L}) + " (attention)";
    const std::string expected = mask_type == "key_padding" ? padding + ", as \"mask_type\" is \"key_padding\""
                                 : mask_type == "attention" ? attention + ", as \"mask_type\" is \"attention\""
                                                            : padding + ", " + attention;
    throw std::invalid_argument(path.string() + ": expected shape " + expected + ", got " + shape_str(s));
}

}  // namespace

void run_layer_command(const std::string& spec_path, const std::string& in_dir, const std::string& out_dir,
                       Device device) {
    const json document = parse_json(read_file(spec_path, "a layer spec (JSON)"), spec_path);
    Spec spec(document, spec_path);
    Generator gen(0);
    LayerRun layer;
    try {
        layer = build_layer(spec, gen);
    } catch (const std::bad_alloc&) {  // sizes each within bounds whose product is not
        throw std::invalid_argument(spec_path +
                                    ": the layer's parameters do not fit in memory; make its sizes smaller");
    }
    const std::string mask_type =
        layer.takes_mask ? spec.reader().text("mask_type", std::string("auto"), {"auto", "key_padding", "attention"})
                         : "auto";
    spec.reader().finish();

    // read and check every input before computing or writing anything
    const fs::path in(in_dir);
    if (!fs::is_directory(in)) throw std::invalid_argument(in_dir + ": not a directory");
    auto require = [&](const std::string& name, const std::string& what) {
        const fs::path path = in / name;
        if (!fs::exists(path)) throw std::invalid_argument(path.string() + ": missing (" + what + ")");
        return path;
    };
    Tensor x = load_floating(require("x.npy", "the layer's input"), layer.dtype);
    const bool x_fits =
        layer.model_dim > 0 ? x.dim() == 3 && x.size(2) == layer.model_dim : x.dim() >= 1 && x.size(-1) == layer.in_dim;
    if (!x_fits) {
        const std::string expected = layer.model_dim > 0 ? shape_pattern({-1, -1, layer.model_dim})
                                                         : "[..., " + std::to_string(layer.in_dim) + "]";
        throw std::invalid_argument((in / "x.npy").string() + ": expected shape " + expected + ", got " +
                                    shape_str(x.shape()));
    }
    Tensor mask;
    if (fs::exists(in / "mask.npy")) {
        if (!layer.takes_mask)
            throw std::invalid_argument((in / "mask.npy").string() + ": this layer type takes no mask");
        mask = load_mask(in / "mask.npy", x.size(0), x.size(1), mask_type == "auto" ? "" : mask_type);
    }
    if (layer.causal) mask = combine_masks(mask, causal_mask(x.size(1), x.size(1)));

    // computed on `device`: the layer, its input, mask and parameters moved there
    layer.module->to(device);
    x = x.to(device);
    if (mask.defined()) mask = mask.to(device);

    std::vector<Tensor> parameters;
    for (const auto& [name, current] : layer.module->named_parameters()) {
        const fs::path path = require(name + ".npy", "the parameter " + name + ", shape " + shape_str(current.shape()));
        Tensor value = load_floating(path, layer.dtype);
        if (value.shape() != current.shape()) {
            throw std::invalid_argument(path.string() + ": expected shape " + shape_str(current.shape()) +
                                        " for the parameter " + name + ", got " + shape_str(value.shape()));
        }
        parameters.push_back(value.to(device).requires_grad_(true));
    }
    layer.module->assign_parameters(parameters);
    x.requires_grad_(true);

    const Tensor y = layer.forward(x, mask);
    Tensor dy = ones_like(y);
    if (fs::exists(in / "dy.npy")) {
        dy = load_floating(in / "dy.npy", layer.dtype).to(device);
        if (dy.shape() != y.shape()) {
            throw std::invalid_argument((in / "dy.npy").string() + ": expected the output's shape " +
                                        shape_str(y.shape()) + ", got " + shape_str(dy.shape()));
        }
    }
    y.backward(dy);

    const fs::path out(out_dir);
    create_output_directory(out, "the output directory (--out)");
    auto gradient_of = [](const Tensor& t) { return t.grad().defined() ? t.grad() : zeros_like(t); };
    save_npy(y, (out / "y.npy").string());
    save_npy(gradient_of(x), (out / "dx.npy").string());
    write_json_file(out / "spec.json", spec.reader().resolved());  // every default filled in
    for (const auto& [name, parameter] : layer.module->named_parameters()) {
        save_npy(gradient_of(parameter), (out / ("grad." + name + ".npy")).string());
    }
}

}  // namespace relgrad
