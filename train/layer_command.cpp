#include "train/layer_command.hpp"

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

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every size of a spec (features, d_model, heads, ff_dim, max_len, k) is at most 2^20, and no
// two of them may multiply to more than 2^28 elements (a parameter of 1 GiB in float32): checked
// as each is read, before anything is allocated, so the error names the key.
constexpr int64_t kMostSize = int64_t{1} << 20;
constexpr int64_t kMostElements = int64_t{1} << 28;

// Reads the spec's keys, each at most once, and complains about any key never read.
class Spec {
public:
    Spec(const json& document, std::string path) : doc_(document), path_(std::move(path)) {
        if (!doc_.is_object()) fail("the spec must be a JSON object");
    }

    std::string text(const std::string& key, const std::string& fallback = "") {
        if (!has(key)) return require_default(key, fallback);
        if (!doc_[key].is_string()) fail("'" + key + "' must be a string, got " + json_excerpt(doc_[key]));
        return doc_[key].get<std::string>();
    }

    // A size in [low, high] (high: kMostSize unless smaller).
    int64_t integer(const std::string& key, int64_t low, std::optional<int64_t> fallback = std::nullopt,
                    int64_t high = kMostSize) {
        if (!has(key)) {
            if (!fallback) fail("'" + key + "' is required");
            return *fallback;
        }
        const json& value = doc_[key];
        if (!is_int64(value) || value.get<int64_t>() < low || value.get<int64_t>() > high) {
            fail("'" + key + "' must be an integer in [" + std::to_string(low) + ", " + std::to_string(high) +
                 "], got " + json_excerpt(value));
        }
        const int64_t size = value.get<int64_t>();
        // A parameter is at most [a size, another size] or [2 k + 1 table rows, a size]: a clipping
        // distance (k, k_left, k_right) is paired with the other sizes only.
        const bool distance = key[0] == 'k';
        const int64_t extent = distance ? 2 * size + 1 : size;
        const Largest& partner = distance || sizes_.extent >= distances_.extent ? sizes_ : distances_;
        if (partner.extent * extent > kMostElements) {
            fail("'" + key + "' = " + std::to_string(size) + " with '" + partner.key +
                 "' = " + std::to_string(partner.value) + " makes a parameter of up to " +
                 std::to_string(partner.extent * extent) + " elements, more than the 2^28 a layer spec may ask for");
        }
        Largest& mine = distance ? distances_ : sizes_;
        if (extent > mine.extent) mine = Largest{extent, size, key};
        return size;
    }

    double number(const std::string& key, double low, double high, double fallback) {
        if (!has(key)) return fallback;
        if (!doc_[key].is_number() || doc_[key].get<double>() < low || doc_[key].get<double>() > high) {
            // the bounds as JSON writes them: 1e-300, not 0.000000
            fail("'" + key + "' must be a number in [" + json(low).dump() + ", " + json(high).dump() + "], got " +
                 json_excerpt(doc_[key]));
        }
        return doc_[key].get<double>();
    }

    bool flag(const std::string& key, bool fallback) {
        if (!has(key)) return fallback;
        if (!doc_[key].is_boolean()) fail("'" + key + "' must be true or false, got " + json_excerpt(doc_[key]));
        return doc_[key].get<bool>();
    }

    void check_all_read() const {
        for (const auto& item : doc_.items()) {
            if (!read_.count(item.key()))
                fail("unknown key '" + item.key() + "' for layer type '" + doc_["type"].get<std::string>() + "'");
        }
    }

    [[noreturn]] void fail(const std::string& message) const { throw std::invalid_argument(path_ + ": " + message); }

private:
    bool has(const std::string& key) {
        read_.insert(key);
        return doc_.contains(key);
    }
    std::string require_default(const std::string& key, const std::string& fallback) {
        if (fallback.empty()) fail("'" + key + "' is required");
        return fallback;
    }

    const json& doc_;
    std::string path_;
    std::set<std::string> read_;
    struct Largest {  // of the sizes or of the clipping distances read so far
        int64_t extent = 1, value = 0;
        std::string key;
    };
    Largest sizes_, distances_;
};

DType parse_dtype(Spec& spec) {
    const std::string name = spec.text("dtype", "float32");
    if (name == "float32") return DType::float32;
    if (name == "float64") return DType::float64;
    spec.fail("'dtype' must be float32 or float64, got \"" + name + "\"");
}

RelativeOptions parse_relative(Spec& spec) {
    RelativeOptions o;
    const int64_t k = spec.integer("k", 0, 8);
    o.k_left = spec.integer("k_left", 0, k);
    o.k_right = spec.integer("k_right", 0, k);  // 2 k + 1 <= 2^21 + 1 buckets: no overflow
    o.share_across_heads = spec.flag("share_across_heads", true);
    o.rank = spec.integer("rank", 0, 0);
    return o;
}

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

LayerRun build_layer(Spec& spec, Generator& gen) {
    const std::string type = spec.text("type");
    const DType dtype = parse_dtype(spec);
    const Init init{gen, dtype};
    LayerRun run;
    run.dtype = dtype;
    if (type == "attention" || type == "relative_attention" || type == "gated_attention") {
        const int64_t dim = spec.integer("d_model", 1), heads = spec.integer("n_heads", 1);
        run.causal = spec.flag("causal", false);
        run.takes_mask = true;
        run.model_dim = dim;
        std::unique_ptr<MultiHeadAttention> attention;
        if (type == "attention") {
            attention = std::make_unique<MultiHeadAttention>(dim, heads, init);
        } else {
            const RelativeOptions relative = parse_relative(spec);
            const AttentionImpl impl = parse_attention_impl(spec.text("impl", "bucketed"));
            if (type == "relative_attention") {
                attention = std::make_unique<RelativeMultiHeadAttention>(dim, heads, relative, impl, init);
            } else {
                attention = std::make_unique<GatedPositionAttention>(dim, heads, relative, impl,
                                                                     spec.flag("token_gate", false), init);
            }
        }
        MultiHeadAttention* raw = attention.get();
        run.forward = [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, x, mask); };
        run.module = std::move(attention);
    } else if (type == "sinusoidal") {
        auto layer = std::make_unique<SinusoidalPositionalEncoding>(spec.integer("d_model", 1));
        run.model_dim = layer->dim;
        SinusoidalPositionalEncoding* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
        run.module = std::move(layer);
    } else if (type == "learned_positions") {
        const int64_t max_len = spec.integer("max_len", 1);
        auto layer = std::make_unique<LearnedPositionalEmbedding>(max_len, spec.integer("d_model", 1), init);
        run.model_dim = layer->dim;
        LearnedPositionalEmbedding* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
        run.module = std::move(layer);
    } else if (type == "linear") {
        const int64_t in = spec.integer("in_features", 1), out = spec.integer("out_features", 1);
        auto layer = std::make_unique<Linear>(in, out, init, spec.flag("bias", true));
        run.in_dim = in;
        Linear* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
        run.module = std::move(layer);
    } else if (type == "layer_norm") {
        const int64_t dim = spec.integer("d_model", 1);
        auto layer = std::make_unique<LayerNorm>(dim, init, spec.number("eps", 1e-300, 1, 1e-5));
        run.in_dim = dim;
        LayerNorm* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
        run.module = std::move(layer);
    } else if (type == "feed_forward") {
        const int64_t dim = spec.integer("d_model", 1);
        auto layer = std::make_unique<FeedForward>(dim, spec.integer("ff_dim", 1), 0.0, init);
        run.in_dim = dim;
        FeedForward* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor&) { return raw->forward(x); };
        run.module = std::move(layer);
    } else if (type == "encoder_layer") {
        TransformerOptions o;
        o.dim = spec.integer("d_model", 1);
        o.heads = spec.integer("n_heads", 1);
        o.ff_dim = spec.integer("ff_dim", 1, 4 * o.dim);  // d_model <= 2^20: 4 d_model fits
        o.dropout = 0;
        o.position = parse_position_mode(spec.text("position", "relative"));
        if (o.position == PositionMode::sinusoidal || o.position == PositionMode::learned) {
            spec.fail(
                "'position' of an encoder_layer must be none, relative or gated (sinusoidal and learned "
                "positions are added to the embeddings, outside the layer)");
        }
        if (o.position != PositionMode::none) o.relative = parse_relative(spec);
        if (o.position != PositionMode::none) o.impl = parse_attention_impl(spec.text("impl", "bucketed"));
        if (o.position == PositionMode::gated) o.token_gate = spec.flag("token_gate", false);
        run.causal = spec.flag("causal", false);
        run.takes_mask = true;
        run.model_dim = o.dim;
        auto layer = std::make_unique<EncoderLayer>(o, init);
        EncoderLayer* raw = layer.get();
        run.forward = [raw](const Tensor& x, const Tensor& mask) { return raw->forward(x, mask); };
        run.module = std::move(layer);
    } else {
        spec.fail("unknown layer type '" + type +
                  "' (expected attention, relative_attention, gated_attention, sinusoidal, learned_positions, "
                  "linear, layer_norm, feed_forward or encoder_layer)");
    }
    run.module->eval();
    return run;
}

Tensor load_floating(const fs::path& path, DType dtype) {
    const Tensor t = load_npy(path.string());
    if (!is_floating(t.dtype())) {
        throw std::invalid_argument(path.string() + ": expected float32 or float64 data, got " + dtype_name(t.dtype()));
    }
    return t.to(dtype);
}

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
        spec.fail("the layer's parameters do not fit in memory; make its sizes smaller");
    }
    const std::string mask_type = layer.takes_mask ? spec.text("mask_type", "auto") : "auto";
    if (mask_type != "auto" && mask_type != "key_padding" && mask_type != "attention") {
        spec.fail("'mask_type' must be auto, key_padding or attention, got \"" + mask_type + "\"");
    }
    spec.check_all_read();

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
    fs::create_directories(out);
    auto gradient_of = [](const Tensor& t) { return t.grad().defined() ? t.grad() : zeros_like(t); };
    save_npy(y, (out / "y.npy").string());
    save_npy(gradient_of(x), (out / "dx.npy").string());
    for (const auto& [name, parameter] : layer.module->named_parameters()) {
        save_npy(gradient_of(parameter), (out / ("grad." + name + ".npy")).string());
    }
}

}  // namespace relgrad
