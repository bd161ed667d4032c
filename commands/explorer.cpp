// The explorer (explorer.hpp, docs/explorer.md). One file: the runs it holds, the page it serves
// and its HTTP API, one handler per route, all over the one Explorer class.
#include "commands/explorer.hpp"

#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "commands/explorer_assets.hpp"
#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/system.hpp"
#include "layers/transformer.hpp"
#include "train/run_directory.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Appends the base64 text of `size` bytes to `out`: each 3 bytes as 4 characters of 6 bits, the
// last 1 or 2 bytes as 2 or 3 characters and '=' padding.
void append_base64(const unsigned char* bytes, std::size_t size, std::string& out) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const std::size_t start = out.size();
    out.resize(start + (size + 2) / 3 * 4, '=');
    char* const text = out.data() + start;
    const int64_t whole = static_cast<int64_t>(size / 3);
    // the arrays of an answer are megabytes: the threads share them
#pragma omp parallel for schedule(static) if (whole > (int64_t{1} << 16))
    for (int64_t n = 0; n < whole; ++n) {
        const unsigned char* b = bytes + 3 * n;
        char* o = text + 4 * n;
        const uint32_t chunk = uint32_t{b[0]} << 16 | uint32_t{b[1]} << 8 | b[2];
        o[0] = alphabet[chunk >> 18 & 63];
        o[1] = alphabet[chunk >> 12 & 63];
        o[2] = alphabet[chunk >> 6 & 63];
        o[3] = alphabet[chunk & 63];
    }
    const std::size_t i = 3 * static_cast<std::size_t>(whole);
    char* o = text + 4 * whole;
    if (i < size) {
        const uint32_t chunk = uint32_t{bytes[i]} << 16 | (i + 1 < size ? uint32_t{bytes[i + 1]} << 8 : 0);
        o[0] = alphabet[chunk >> 18 & 63];
        o[1] = alphabet[chunk >> 12 & 63];
        if (i + 1 < size) o[2] = alphabet[chunk >> 6 & 63];
    }
}

// The values' bytes as a JSON binary value, which json_text writes as a base64 string
template <class T>
json packed_bytes(const T* values, const Shape& shape, const char* dtype) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(values);
    return {{"dtype", dtype},
            {"shape", shape},
            {"data", json::binary(std::vector<uint8_t>(bytes, bytes + shape_numel(shape) * sizeof(T)))}};
}

// A tensor's exact values, {"dtype", "shape", "data": base64 of the values in C order, in this
// machine's byte order (little-endian: x86-64)}: float64 as float64, booleans as uint8, every
// other dtype as float32 (which holds float32, bfloat16 and float16 values exactly).
json packed(const Tensor& t) {
    const Tensor host = t.to(Device::cpu);
    if (t.dtype() == DType::float64) return packed_bytes(host.contiguous().data<double>(), t.shape(), "float64");
    if (t.dtype() == DType::boolean) {
        const std::vector<double> values = host.to_vector();
        const std::vector<uint8_t> bytes(values.begin(), values.end());
        return packed_bytes(bytes.data(), t.shape(), "uint8");
    }
    return packed_bytes(host.to(DType::float32).contiguous().data<float>(), t.shape(), "float32");
}

// JSON text of an answer: the arrays' bytes (binary values) as base64 strings, written straight
// into the text (they are most of an answer: 8 MB for the larger bench model at L = 128); plain
// strings copied as they are; the rest written by nlohmann's dump (any invalid UTF-8 replaced,
// never thrown).
void write_json(const json& value, std::string& out) {
    const auto write_string = [&out](const std::string& text) {
        const bool plain = std::all_of(text.begin(), text.end(),
                                       [](unsigned char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
        if (plain) {
            out += '"';
            out += text;
            out += '"';
        } else {
            out += json(text).dump(-1, ' ', false, json::error_handler_t::replace);
        }
    };
    if (value.is_object()) {
        out += '{';
        for (auto item = value.begin(); item != value.end(); ++item) {
            if (item != value.begin()) out += ',';
            write_string(item.key());
            out += ':';
            write_json(item.value(), out);
        }
        out += '}';
    } else if (value.is_array()) {
        out += '[';
        for (std::size_t i = 0; i < value.size(); ++i) {
            if (i > 0) out += ',';
            write_json(value[i], out);
        }
        out += ']';
    } else if (value.is_string()) {
        write_string(value.get_ref<const std::string&>());
    } else if (value.is_binary()) {
        const json::binary_t& bytes = value.get_binary();
        out += '"';
        append_base64(bytes.data(), bytes.size(), out);
        out += '"';
    } else {
        out += value.dump();
    }
}

// At least the length of value's text when its strings are plain: written into memory taken once
std::size_t text_size(const json& value) {
    if (value.is_string()) return value.get_ref<const std::string&>().size() + 2;
    if (value.is_binary()) return (value.get_binary().size() + 2) / 3 * 4 + 2;
    if (!value.is_structured()) return 24;
    std::size_t size = 2;
    for (auto item = value.begin(); item != value.end(); ++item)
        size += text_size(item.value()) + (value.is_object() ? item.key().size() + 4 : 1);
    return size;
}

std::string json_text(const json& value) {
    std::string out;
    out.reserve(text_size(value));
    write_json(value, out);
    return out;
}

json packed_or_null(const Tensor& t) { return t.defined() ? packed(t) : json(); }

// What a table of vectors (rows) says about how alike its rows are: cosine similarity [n, n].
Tensor row_similarity(const Tensor& rows) {
    const Tensor wide = rows.to(DType::float64);
    const Tensor unit = div(wide, sqrt(add(sum(mul(wide, wide), {-1}, true), scalar(1e-300, DType::float64))));
    return matmul(unit, unit.transpose(0, 1));
}

// The position parameters of one self-attention layer; the most derived class first.
json layer_parameters(const MultiHeadAttention& layer) {
    NoGradGuard no_grad;
    if (const auto* gated = dynamic_cast<const GatedPositionAttention*>(&layer)) {
        return {{"kind", "gated"},
                {"k_left", gated->rel_pos_emb_k.k_left},
                {"k_right", gated->rel_pos_emb_k.k_right},
                {"E_K", packed(gated->rel_pos_emb_k.table())},
                {"E_V", gated->value_term ? packed(gated->rel_pos_emb_v.table()) : json()},
                {"gates", gated->gate_values()},
                {"token_gate", gated->token_gate}};
    }
    if (const auto* shaw = dynamic_cast<const RelativeMultiHeadAttention*>(&layer)) {
        return {{"kind", "relative"},
                {"k_left", shaw->rel_pos_emb_k.k_left},
                {"k_right", shaw->rel_pos_emb_k.k_right},
                {"E_K", packed(shaw->rel_pos_emb_k.table())},
                {"E_V", shaw->value_term ? packed(shaw->rel_pos_emb_v.table()) : json()}};
    }
    if (const auto* rotary = dynamic_cast<const RotaryMultiHeadAttention*>(&layer)) {
        std::vector<double> frequencies;  // theta_t = base^(-2t/Dh), radians per position
        for (int64_t t = 0; t < rotary->head_dim / 2; ++t)
            frequencies.push_back(std::pow(rotary->base, -2.0 * static_cast<double>(t) / rotary->head_dim));
        return {{"kind", "rope"}, {"base", rotary->base}, {"frequencies", frequencies}};
    }
    if (const auto* alibi = dynamic_cast<const AlibiAttention*>(&layer)) {
        return {{"kind", "alibi"}, {"slopes", alibi->slopes}};
    }
    if (const auto* t5 = dynamic_cast<const T5BiasAttention*>(&layer)) {
        // b_h(d) = W[bucket(d), h] over the distances d = j - i up to twice max_distance (at most
        // 256): the layer's own row of biases by distance, as its fused form reads it
        const int64_t reach = std::min<int64_t>(2 * t5->max_distance, 256);
        std::vector<int64_t> distances;
        for (int64_t d = -reach; d <= reach; ++d) distances.push_back(d);
        return {{"kind", "t5"},
                {"buckets", t5->num_buckets},
                {"max_distance", t5->max_distance},
                {"bidirectional", t5->bidirectional},
                {"distances", distances},
                {"bias", packed(t5->distance_bias(reach + 1, reach + 1, 0))}};
    }
    return {{"kind", "none"}};
}

// The absolute positions added to the embeddings, as the similarity of their vectors [P, P]
// (P at most 128), or null for a model without them.
json absolute_positions(const LoadedRun& run) {
    NoGradGuard no_grad;
    const TransformerOptions& o = run.config.model.transformer;
    const int64_t shown = std::min<int64_t>(o.max_positions, 128);
    if (o.position == PositionMode::sinusoidal) {
        return {{"kind", "sinusoidal"},
                {"similarity",
                 packed(row_similarity(SinusoidalPositionalEncoding(o.dim).encoding(shown, DType::float64)))}};
    }
    if (o.position == PositionMode::learned) {
        // TokenEmbedding's table "positions" (the encoder's, "embed." or "source_embed.", comes first)
        const std::string table = "embed.positions.weight";
        for (const auto& [name, weight] : run.task->model().named_parameters()) {
            if (name.size() >= table.size() && name.compare(name.size() - table.size(), table.size(), table) == 0) {
                return {{"kind", "learned"},
                        {"table", name},
                        {"similarity", packed(row_similarity(weight.narrow(0, 0, shown)))}};
            }
        }
    }
    return json();
}

// A tensor [1, ...] without its batch dimension, expanded to `shape`.
Tensor one_example(const Tensor& t, const Shape& shape) {
    return t.expand(broadcast_shapes(t.shape(), shape, "explorer")).squeeze(0);
}

// A mask broadcastable to [1, H, L, L] (the same for every head of one input) as [L, L], or
// undefined when it masks nothing
Tensor pair_mask(Tensor mask, int64_t L) {
    if (!mask.defined()) return mask;
    while (mask.dim() < 4) mask = mask.unsqueeze(0);
    mask = mask.narrow(0, 0, 1).narrow(1, 0, 1).expand({1, 1, L, L}).reshape({L, L});
    const std::vector<double> allowed = mask.to_vector();
    return std::find(allowed.begin(), allowed.end(), 0.0) == allowed.end() ? Tensor() : mask;
}

}  // namespace

// ---------------------------------------------------------------- the runs

struct Explorer::Run {
    std::string dir, name;
    LoadedRun loaded;
    json config, summary;
    json parameters;  // they never change: taken once, at loading
};

// The models compute on a thread of their own, one request at a time: the layers keep their last
// forward, and OpenMP keeps a team of threads for every thread that starts parallel work (with the
// model work on 40 server threads, 40 teams would spin on this machine's cores: 4 ms more per
// request at L = 16).
class Explorer::ModelThread {
public:
    explicit ModelThread(int64_t max_waiting) : max_waiting_(max_waiting), thread_([this] { work(); }) {}
    ~ModelThread() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_one();
        thread_.join();
    }
    ModelThread(const ModelThread&) = delete;
    ModelThread& operator=(const ModelThread&) = delete;

    // job's result, or its exception, once the thread has run it
    json run(const std::function<json()>& job) {
        std::future<json> result;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (pending_ >= max_waiting_) {
                throw ApiError(503, "busy: " + std::to_string(max_waiting_) +
                                        " model requests are in flight or waiting; try again");
            }
            ++pending_;
            jobs_.emplace_back(job);
            result = jobs_.back().get_future();
        }
        wake_.notify_one();
        return result.get();
    }

private:
    void work() {
        for (;;) {
            std::packaged_task<json()> job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
                if (jobs_.empty()) return;  // stopping, and nothing left to do
                job = std::move(jobs_.front());
                jobs_.pop_front();
            }
            job();  // an exception is kept in the job's future
            std::lock_guard<std::mutex> lock(mutex_);
            --pending_;
        }
    }

    const int64_t max_waiting_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::packaged_task<json()>> jobs_;
    int64_t pending_ = 0;  // jobs queued or running
    bool stopping_ = false;
    std::thread thread_;
};

Explorer::Explorer(const std::vector<std::string>& run_dirs, ExplorerLimits limits, Device device)
    : limits_(limits), model_thread_(std::make_unique<ModelThread>(limits.max_waiting)) {
    RELGRAD_CHECK(!run_dirs.empty(), "explore: name at least one run directory");
    for (const std::string& dir : run_dirs) {
        auto run = std::make_unique<Run>();
        run->dir = dir;
        run->name = fs::path(dir).lexically_normal().filename().string();
        if (run->name.empty()) run->name = fs::path(dir).lexically_normal().parent_path().filename().string();
        try {
            run->loaded = load_run(dir, "", /*weights_kept=*/true, device);
            run->config = read_json_file(fs::path(dir) / "config.json");
            if (fs::exists(fs::path(dir) / "summary.json"))
                run->summary = read_json_file(fs::path(dir) / "summary.json");
            json layers = json::array();
            for (const MultiHeadAttention* layer : run->loaded.task->attention_layers())
                layers.push_back(layer_parameters(*layer));
            run->parameters = {{"position", position_mode_name(run->loaded.config.model.transformer.position)},
                               {"layers", layers},
                               {"absolute", absolute_positions(run->loaded)}};
        } catch (const std::invalid_argument& e) {
            const std::string message = e.what();
            // load_run's own errors name the directory already
            throw std::invalid_argument(message.rfind(dir, 0) == 0 ? message : dir + ": " + message);
        }
        runs_.push_back(std::move(run));
    }
}

Explorer::~Explorer() = default;

Explorer::Run& Explorer::run_at(int64_t run) const {
    if (run < 0 || run >= run_count()) {
        throw ApiError(404, "no run " + std::to_string(run) + ": the runs are 0.." + std::to_string(run_count() - 1));
    }
    return *runs_[static_cast<std::size_t>(run)];
}

json Explorer::runs() const {
    json out = json::array();
    for (int64_t id = 0; id < run_count(); ++id) {
        const Run& run = *runs_[static_cast<std::size_t>(id)];
        const Config& c = run.loaded.config;
        out.push_back({{"id", id},
                       {"name", run.name},
                       {"dir", run.dir},
                       {"task", task_kind_name(c.task.kind)},
                       {"position", position_mode_name(c.model.transformer.position)},
                       {"precision", dtype_name(c.training.precision)},
                       {"parameters", run.loaded.task->model().parameter_count()},
                       {"metric", run.loaded.task->metric()},
                       {"max_tokens", c.model.transformer.max_positions},
                       {"config", run.config},
                       {"summary", run.summary}});
    }
    return out;
}

json Explorer::metrics(int64_t id) const {
    const Run& run = run_at(id);
    json lines = json::array();
    std::ifstream file(fs::path(run.dir) / "metrics.jsonl");
    for (std::string line; std::getline(file, line);) {
        // a line being written while we read is left for the next request
        json entry = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!entry.is_discarded()) lines.push_back(std::move(entry));
    }
    return lines;
}

json Explorer::parameters(int64_t id) const { return run_at(id).parameters; }

// The request checked here (the tokenizer is only read), the model's work queued on its thread
json Explorer::look(int64_t id, const std::string& prompt) {
    const LoadedRun& loaded = run_at(id).loaded;
    std::vector<int64_t> ids;
    try {
        ids = prompt_ids(loaded, prompt, "prompt");
    } catch (const PromptTooLong& e) {
        throw ApiError(413, e.what());
    } catch (const std::invalid_argument& e) {
        throw ApiError(400, e.what());
    }
    if (ids.empty()) throw ApiError(400, "prompt: the prompt has no tokens");
    const int64_t tokens = static_cast<int64_t>(ids.size());
    if (tokens > limits_.max_prompt_tokens) {
        throw ApiError(413, "the prompt has " + std::to_string(tokens) + " tokens; the explorer shows at most " +
                                std::to_string(limits_.max_prompt_tokens));
    }
    return model_thread_->run([&] { return look_here(id, prompt, ids); });
}

json Explorer::look_here(int64_t id, const std::string& prompt, const std::vector<int64_t>& ids) {
    LoadedRun& loaded = run_at(id).loaded;
    const int64_t tokens = static_cast<int64_t>(ids.size());
    const TransformerOptions& model = loaded.config.model.transformer;
    const std::vector<MultiHeadAttention*> layers = loaded.task->attention_layers();
    // the layers keep their score parts for this forward alone
    struct KeepParts {
        const std::vector<MultiHeadAttention*>& layers;
        explicit KeepParts(const std::vector<MultiHeadAttention*>& l) : layers(l) {
            for (MultiHeadAttention* layer : layers) layer->keep_score_parts = true;
        }
        ~KeepParts() {
            for (MultiHeadAttention* layer : layers) {
                layer->keep_score_parts = false;
                layer->last_score_parts = {};
            }
        }
    };
    const TaskKind kind = loaded.config.task.kind;
    const bool classifier = !(kind == TaskKind::language_model || is_pair_task(kind));
    json out{{"run", id}, {"prompt", prompt}, {"layers", json::array()}};
    {
        KeepParts keep(layers);
        NoGradGuard no_grad;
        // the weights relgrad attention writes; a classifier's from the forward of its answer (one
        // forward, the one Task::attention runs), the others' from Task::attention
        std::vector<Tensor> weights;
        if (classifier) {
            const std::vector<double> p = loaded.task->class_probabilities(ids);
            out["answer"] = {
                {"kind", "class"}, {"class", std::max_element(p.begin(), p.end()) - p.begin()}, {"probabilities", p}};
            for (const MultiHeadAttention* layer : layers) weights.push_back(layer->last_weights.squeeze(0));
        } else {
            weights = loaded.task->attention(ids);
        }
        for (std::size_t l = 0; l < layers.size(); ++l) {
            const MultiHeadAttention::ScoreParts& parts = layers[l]->last_score_parts;
            const int64_t H = layers[l]->heads, L = tokens;
            out["layers"].push_back(
                {{"weights", packed(weights[l])},
                 {"content", packed(parts.content.squeeze(0))},
                 {"position", packed(parts.position.squeeze(0))},
                 {"allowed", packed_or_null(pair_mask(parts.mask, L))},
                 {"value_share", packed_or_null(parts.value_share.defined() ? parts.value_share.squeeze(0) : Tensor())},
                 {"gate", packed_or_null(parts.gate.defined() ? one_example(parts.gate, {1, H, L, 1}).squeeze(-1)
                                                              : Tensor())}});
        }
    }
    json token_texts = json::array();
    for (int64_t token : ids) token_texts.push_back(output_text(loaded, {token}));
    out["tokens"] = token_texts;
    if (!classifier) {
        NoGradGuard no_grad;
        out["answer"] = {{"kind", kind == TaskKind::language_model ? "continuation" : "target"}};
        try {
            // learned positions: the answer must fit the table, after the prompt (and a separator)
            // in a decoder-only model, after the start token in an encoder-decoder's decoder
            const bool decoder_only = kind == TaskKind::language_model || loaded.config.task.decoder_only;
            const int64_t first = decoder_only ? tokens + 1 : 1;
            const int64_t room =
                model.position == PositionMode::learned ? model.max_positions - first : limits_.max_answer_tokens;
            RELGRAD_CHECK(room >= 1, "no room is left in the table of learned positions");
            const std::vector<int64_t> answer = loaded.task->generate(ids, std::min(room, limits_.max_answer_tokens));
            out["answer"]["text"] = output_text(loaded, answer);
        } catch (const std::invalid_argument& e) {  // the weights are shown all the same
            out["answer"]["error"] = e.what();
        }
    }
    return out;
}

// ---------------------------------------------------------------- the page

std::string explorer_page(const json& data) {
    // the data inside a <script> element: "</" and "<!" occur only in JSON strings, where "\/" and
    // "\u0021" spell the same characters, so the HTML parser never sees an end tag or a comment
    const std::string text = json_text(data);
    std::string safe;
    safe.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '<' && i + 1 < text.size() && (text[i + 1] == '/' || text[i + 1] == '!')) {
            safe += text[i + 1] == '/' ? "<\\/" : "<\\u0021";
            ++i;
        } else {
            safe += text[i];
        }
    }
    std::string page = explorer_assets::page_html;
    const auto put = [&page](const std::string& mark, const std::string& what) {
        const std::size_t at = page.find(mark);
        RELGRAD_INTERNAL_ASSERT(at != std::string::npos, "explorer page: no ", mark);
        page.replace(at, mark.size(), what);
    };
    put("/*relgrad:style*/", explorer_assets::style_css);
    put("/*relgrad:script*/", explorer_assets::explorer_js);
    put("/*relgrad:data*/", safe);
    return page;
}

std::string export_page(Explorer& explorer, const std::vector<std::string>& prompts) {
    RELGRAD_CHECK(!prompts.empty(), "--export: give at least one --prompt to show");
    json data{{"runs", explorer.runs()},
              {"metrics", json::object()},
              {"parameters", json::object()},
              {"looks", json::object()}};
    for (int64_t id = 0; id < explorer.run_count(); ++id) {
        const std::string key = std::to_string(id);
        data["metrics"][key] = explorer.metrics(id);
        data["parameters"][key] = explorer.parameters(id);
        data["looks"][key] = json::array();
        for (const std::string& prompt : prompts) {
            try {
                data["looks"][key].push_back(explorer.look(id, prompt));
            } catch (const ApiError& e) {
                throw std::invalid_argument("--prompt '" + prompt + "' for " +
                                            explorer.runs()[id]["dir"].get<std::string>() + ": " + e.what());
            }
        }
    }
    return explorer_page(data);
}

// ---------------------------------------------------------------- the server

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

namespace {

void send_json(httplib::Response& response, const json& body, int status = 200) {
    response.status = status;
    response.body = json_text(body);  // moved in: set_content would copy it
    // with a charset, httplib does not compress it for a browser that accepts brotli or gzip:
    // brotli took 15 s for the 8 MB of an attention answer, which is on its way in 10 ms uncompressed
    response.set_header("Content-Type", "application/json; charset=utf-8");
}

int64_t run_id(const httplib::Request& request) {
    return std::stoll(request.matches[1].str());  // (\d{1,9}): always a number that fits
}

}  // namespace

void serve(Explorer& explorer, const std::string& host, int port,
           const std::function<void(const std::string&)>& listening, const std::function<bool()>& stop) {
    // One malloc arena for every thread: each answer's megabytes then reuse the memory of the
    // last one, where an arena per server thread maps fresh pages for every answer (the larger
    // bench model's attention at L = 128: 100 ms a request with arenas per thread, 60 ms with one)
    mallopt(M_ARENA_MAX, 1);
    httplib::Server server;
    // SO_REUSEADDR alone: a port another server listens on is refused (httplib's default,
    // SO_REUSEPORT, would share it with that server)
    server.set_socket_options([](socket_t socket) {
        int yes = 1;
        setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server.set_payload_max_length(static_cast<std::size_t>(explorer.limits().max_request_bytes));
    // threads for every model request allowed to wait, and 8 more for the rest meanwhile; an idle
    // connection kept open gives its thread back within 2 s
    const auto threads = static_cast<std::size_t>(explorer.limits().max_waiting + 8);
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_keep_alive_timeout(2);
    // A page on another site could make a browser here send requests: it cannot set a Host header
    // other than its own name, nor POST JSON without asking first (a CORS preflight, which no
    // answer here allows). So on loopback only loopback names are served, and a POST must be JSON.
    const bool loopback = is_loopback(host);
    server.set_pre_routing_handler([loopback](const httplib::Request& request, httplib::Response& response) {
        const std::string host_header = request.get_header_value("Host");
        const std::string name = host_header.rfind('[', 0) == 0 ? host_header.substr(0, host_header.find(']') + 1)
                                                                : host_header.substr(0, host_header.find(':'));
        if (loopback && name != "127.0.0.1" && name != "localhost" && name != "[::1]") {
            send_json(response,
                      {{"error", "the Host header '" + host_header +
                                     "' names another machine: this server answers 127.0.0.1 and localhost only"}},
                      403);
            return httplib::Server::HandlerResponse::Handled;
        }
        if (request.method == "POST" && request.get_header_value("Content-Type").rfind("application/json", 0) != 0) {
            send_json(response, {{"error", "a POST's body must be JSON, sent as Content-Type: application/json"}}, 415);
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });

    const std::string page = explorer_page(json());
    server.Get("/", [&page](const httplib::Request&, httplib::Response& response) {
        response.set_content(page, "text/html; charset=utf-8");
    });
    server.Get("/api/runs", [&explorer](const httplib::Request&, httplib::Response& response) {
        send_json(response, explorer.runs());
    });
    server.Get(R"(/api/runs/(\d{1,9})/metrics)",
               [&explorer](const httplib::Request& request, httplib::Response& response) {
                   send_json(response, explorer.metrics(run_id(request)));
               });
    server.Get(R"(/api/runs/(\d{1,9})/parameters)",
               [&explorer](const httplib::Request& request, httplib::Response& response) {
                   send_json(response, explorer.parameters(run_id(request)));
               });
    server.Post(R"(/api/runs/(\d{1,9})/attention)",
                [&explorer](const httplib::Request& request, httplib::Response& response) {
                    const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
                    if (!body.is_object() || !body.contains("prompt") || !body["prompt"].is_string()) {
                        throw ApiError(400, "the body must be a JSON object {\"prompt\": TEXT}");
                    }
                    send_json(response, explorer.look(run_id(request), body["prompt"].get<std::string>()));
                });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
        try {
            std::rethrow_exception(error);
        } catch (const ApiError& e) {
            send_json(response, {{"error", e.what()}}, e.status);
        } catch (const std::invalid_argument& e) {
            send_json(response, {{"error", e.what()}}, 400);
        } catch (const std::exception& e) {
            send_json(response, {{"error", std::string("internal error: ") + e.what()}}, 500);
        } catch (...) {
            send_json(response, {{"error", "internal error"}}, 500);
        }
    });
    // what httplib answers by itself (no such path 404, a body past the limit 413, ...) as JSON too
    server.set_error_handler([](const httplib::Request&, httplib::Response& response) {
        if (!response.body.empty()) return;
        std::string message = "HTTP error " + std::to_string(response.status);
        if (response.status == 400) message = "a malformed request";
        if (response.status == 404) message = "no such page or API path";
        if (response.status == 413) message = "the request is larger than this server accepts";
        if (response.status == 414) message = "the request's address is longer than this server accepts";
        send_json(response, {{"error", message}}, response.status);
    });

    const int asked = port;
    const bool bound = port == 0 ? (port = server.bind_to_any_port(host)) > 0 : server.bind_to_port(host, port);
    RELGRAD_CHECK(bound, "explore: cannot listen on ", host, ":", asked,
                  " (in use, or not an address of this machine); choose another with --port or --host");
    listening("http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port) +
              "/");
    std::atomic<bool> stopped{false};
    std::thread listener([&server, &stopped] {
        server.listen_after_bind();
        stopped = true;
    });
    while (!stop()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // httplib's stop() does nothing before the listener runs: asked until the listener has ended
    while (!stopped) {
        server.stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    listener.join();
}

}  // namespace relgrad
