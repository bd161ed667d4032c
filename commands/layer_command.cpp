#include "commands/layer_command.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "engine/errors.hpp"
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

// Every size of a spec that no options description bounds (in_features, out_features,
// max_positions, the dim of sinusoidal, learned_positions and layer_norm) is at most 2^20, and no
// parameter may have more than 2^28 elements (1 GiB in float32): checked on the sizes read, before
// anything is allocated, so that the error names the key.
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

// A layer that attends: x [B, L, D] and the mask; "causal" adds the causal rule.
LayerRun attention_run(std::unique_ptr<Module> layer, std::function<Tensor(const Tensor&, const Tensor&)> forward,
                       int64_t dim, bool causal) {
    LayerRun run;
    run.module = std::move(layer);
    run.forward = std::move(forward);
    run.model_dim = dim;
    run.takes_mask = true;
    run.causal = causal;
    return run;
}

// An attention layer with the position scheme `position`: its options as the model's description
// has them (attention_option_fields: the same names, defaults and rules), built by make_attention.
template <PositionMode position>
LayerRun build_attention(Spec& spec, const Init& init) {
    TransformerOptions o;
    o.position = position;
    const bool causal = spec.flag("causal", false);
    bool t5_bidirectional = true;
    attention_option_fields(spec, position, o, t5_bidirectional, /*bidirectional_default=*/!causal);
    std::unique_ptr<MultiHeadAttention> attention = make_attention(o, init, t5_bidirectional);
    MultiHeadAttention* raw = attention.get();
    return attention_run(
        std::move(attention), [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, x, mask); }, o.dim,
        causal);
}

LayerRun build_sinusoidal(Spec& spec, const Init&) {
    const int64_t dim = spec.size("dim");
    return run_of(std::make_unique<SinusoidalPositionalEncoding>(dim), dim, -1);
}

LayerRun build_learned_positions(Spec& spec, const Init& init) {
    const int64_t max_positions = spec.size("max_positions"), dim = spec.size("dim");
    spec.require_parameter("dim", dim, "max_positions", max_positions);
    return run_of(std::make_unique<LearnedPositionalEmbedding>(max_positions, dim, init), dim, -1);
}

LayerRun build_linear(Spec& spec, const Init& init) {
    const int64_t in = spec.size("in_features"), out = spec.size("out_features");
    spec.require_parameter("out_features", out, "in_features", in);
    return run_of(std::make_unique<Linear>(in, out, init, spec.flag("bias", true)), -1, in);
}

LayerRun build_layer_norm(Spec& spec, const Init& init) {
    const int64_t dim = spec.size("dim");
    const double eps = spec.reader().number("eps", 0, 1, layer_norm_eps, true);
    return run_of(std::make_unique<LayerNorm>(dim, init, eps), -1, dim);
}

LayerRun build_feed_forward(Spec& spec, const Init& init) {  // dim and ff_dim as the model's description has them
    TransformerOptions o;
    dim_field(spec, o);
    ff_dim_field(spec, o);
    spec.require_parameter("ff_dim", o.ff_dim, "dim", o.dim);
    return run_of(std::make_unique<FeedForward>(o.dim, o.ff_dim, 0.0, init), -1, o.dim);
}

LayerRun build_encoder_layer(Spec& spec, const Init& init) {
    TransformerOptions o;
    block_option_fields(spec, o);  // layers/transformer.hpp
    spec.check(o.position != PositionMode::sinusoidal && o.position != PositionMode::learned, "position",
               "none, relative, gated, rope, alibi or t5 (sinusoidal and learned positions are added to the "
               "embeddings, outside the layer)");
    spec.require_parameter("ff_dim", o.ff_dim, "dim", o.dim);  // [D, D] and the tables are within it
    const bool causal = spec.flag("causal", false);
    auto layer = std::make_unique<EncoderLayer>(o, init);
    EncoderLayer* raw = layer.get();
    return attention_run(
        std::move(layer), [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, mask); }, o.dim, causal);
}

// The layer types of a spec's "type", each with the function that reads its options and builds it.
struct LayerType {
    const char* name;
    LayerRun (*build)(Spec& spec, const Init& init);
};
constexpr LayerType layer_types[] = {
    {"attention", build_attention<PositionMode::none>},
    {"relative_attention", build_attention<PositionMode::relative>},
    {"gated_attention", build_attention<PositionMode::gated>},
    {"rope_attention", build_attention<PositionMode::rope>},
    {"alibi_attention", build_attention<PositionMode::alibi>},
    {"t5_attention", build_attention<PositionMode::t5>},
    {"sinusoidal", build_sinusoidal},
    {"learned_positions", build_learned_positions},
    {"linear", build_linear},
    {"layer_norm", build_layer_norm},
    {"feed_forward", build_feed_forward},
    {"encoder_layer", build_encoder_layer},
};

LayerRun build_layer(Spec& spec, Generator& gen) {
    std::vector<std::string> names;
    for (const LayerType& type : layer_types) names.push_back(type.name);
    const std::string name = spec.reader().text("type");
    const auto type = std::find_if(std::begin(layer_types), std::end(layer_types),
                                   [&](const LayerType& t) { return name == t.name; });
    if (type == std::end(layer_types)) spec.reader().fail("type", "a layer type: " + names_text(names));
    DType dtype = DType::float32;
    spec.named("dtype", dtype, floating_dtype_names, DType::float32);
    LayerRun run = type->build(spec, Init{gen, dtype});
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
    RELGRAD_CHECK(!(padding_shape && square && mask_type.empty()), path.string(), ": shape [", B, ", ", L,
                  "] could be key padding [B, L] or an attention mask [L, L]; set \"mask_type\" to \"key_padding\" "
                  "or \"attention\" in the spec");
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
    RELGRAD_CHECK(false, path.string(), ": expected shape ", expected, ", got ", shape_str(s));
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
    RELGRAD_CHECK(fs::exists(in), in_dir, ": does not exist (--in, the directory of x.npy and the parameters)");
    RELGRAD_CHECK(fs::is_directory(in), in_dir, ": not a directory (--in, the directory of x.npy and the parameters)");
    auto require = [&](const std::string& name, const std::string& what) {
        const fs::path path = in / name;
        RELGRAD_CHECK(fs::exists(path), path.string(), ": missing (", what, ")");
        return path;
    };
    Tensor x = load_floating(require("x.npy", "the layer's input"), layer.dtype);
    const bool x_fits =
        layer.model_dim > 0 ? x.dim() == 3 && x.size(2) == layer.model_dim : x.dim() >= 1 && x.size(-1) == layer.in_dim;
    const std::string expected_x =
        layer.model_dim > 0 ? shape_pattern({-1, -1, layer.model_dim}) : "[..., " + std::to_string(layer.in_dim) + "]";
    RELGRAD_CHECK(x_fits, (in / "x.npy").string(), ": expected shape ", expected_x, ", got ", shape_str(x.shape()));
    Tensor mask;
    if (fs::exists(in / "mask.npy")) {
        RELGRAD_CHECK(layer.takes_mask, (in / "mask.npy").string(), ": this layer type takes no mask");
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
        RELGRAD_CHECK(value.shape() == current.shape(), path.string(), ": expected shape ", shape_str(current.shape()),
                      " for the parameter ", name, ", got ", shape_str(value.shape()));
        parameters.push_back(value.to(device).requires_grad_(true));
    }
    layer.module->assign_parameters(parameters);
    x.requires_grad_(true);

    const Tensor y = layer.forward(x, mask);
    Tensor dy = ones_like(y);
    if (fs::exists(in / "dy.npy")) {
        dy = load_floating(in / "dy.npy", layer.dtype).to(device);
        RELGRAD_CHECK(dy.shape() == y.shape(), (in / "dy.npy").string(), ": expected the output's shape ",
                      shape_str(y.shape()), ", got ", shape_str(dy.shape()));
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
