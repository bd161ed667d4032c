// relgrad explore: what trained runs learned, looked at in a browser (docs/explorer.md).
//
//   Explorer      the runs named on the command line, each loaded once, and the JSON answers of
//                 the API: runs, metrics, position parameters, and a look at one prompt (the
//                 attention weights of every layer and head with the score split into content
//                 and position, computed by the layers themselves: MultiHeadAttention::ScoreParts)
//   serve         the API and the page over HTTP (cpp-httplib), on 127.0.0.1 unless told otherwise
//   export_page   the page with its data inside, one HTML file that needs no server and no network
//
// Arrays travel as {"dtype": "float32" | "float64" | "uint8", "shape": [...], "data": base64 of
// the values in C order, little-endian}: the exact values the model computed, a quarter of the
// size of decimal text. In the JSON values below, "data" is a binary value (the bytes themselves);
// the server and explorer_page write it as base64.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands/run_commands.hpp"

namespace relgrad {

// A request the API refuses: the HTTP status (400 bad request, 404 no such run, 413 too large,
// 503 busy) and a message naming the problem.
class ApiError : public std::runtime_error {
public:
    ApiError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
    int status;
};

// What one server accepts.
struct ExplorerLimits {
    int64_t max_request_bytes = 64 * 1024;  // a request's body (413 past it)
    int64_t max_waiting = 32;               // model requests in flight or waiting (503 past it)
    int64_t max_answer_tokens = 64;         // a continuation or target shown beside the prompt
    // a prompt's tokens (413 past it; and past the table of learned positions): an answer holds
    // 3 L^2 values per head and layer, 25 MB for 4 layers of 8 heads at L = 256
    int64_t max_prompt_tokens = 256;
};

class Explorer {
public:
    // Loads every run on `device` (std::invalid_argument naming the directory that is not a
    // readable run).
    explicit Explorer(const std::vector<std::string>& run_dirs, ExplorerLimits limits = {},
                      Device device = Device::cpu);
    ~Explorer();

    int64_t run_count() const { return static_cast<int64_t>(runs_.size()); }
    const ExplorerLimits& limits() const { return limits_; }

    // GET /api/runs: [{id, name, dir, task, position, parameters, metric, config, summary}]
    nlohmann::json runs() const;
    // GET /api/runs/ID/metrics: the lines of metrics.jsonl as they were written
    nlohmann::json metrics(int64_t run) const;
    // GET /api/runs/ID/parameters: the position parameters of each self-attention layer and the
    // absolute positions' similarity (docs/explorer.md lists the keys per scheme), taken at loading
    nlohmann::json parameters(int64_t run) const;
    // POST /api/runs/ID/attention {"prompt": TEXT}: the prompt's tokens, the model's answer and
    // per layer the weights [H, L, L] (the same as `relgrad attention`), the score's content and
    // position parts [H, L, L], the masked pairs [L, L], the value share [H, L] (Shaw's value
    // term) and the gate [H, L] (gated layers)
    nlohmann::json look(int64_t run, const std::string& prompt);

private:
    struct Run;
    Run& run_at(int64_t run) const;  // ApiError 404 for an id that names no run
    // look()'s work on the model thread, for the prompt's tokens `ids`
    nlohmann::json look_here(int64_t run, const std::string& prompt, const std::vector<int64_t>& ids);
    // The thread the models compute on, one request at a time (ApiError 503 past max_waiting)
    class ModelThread;

    ExplorerLimits limits_;
    std::vector<std::unique_ptr<Run>> runs_;
    std::unique_ptr<ModelThread> model_thread_;
};

// The explorer's page: server mode (data null: it asks the API) or with `data` inside, as
// {"runs": ..., "metrics": {ID: ...}, "parameters": {ID: ...}, "looks": {ID: [look, ...]}}.
std::string explorer_page(const nlohmann::json& data);

// The whole view of every run for each prompt, one self-contained HTML file's text.
std::string export_page(Explorer& explorer, const std::vector<std::string>& prompts);

// Whether `host` is this machine's loopback address (127.0.0.1, localhost, ::1): the only one
// that no other machine reaches.
bool is_loopback(const std::string& host);

// Serves the page and the API on host:port (port 0: a free one) until `stop` returns true (asked
// every 100 ms). `listening` is told the address once the port is bound. std::invalid_argument
// when the address cannot be bound.
void serve(Explorer& explorer, const std::string& host, int port,
           const std::function<void(const std::string&)>& listening, const std::function<bool()>& stop);

}  // namespace relgrad
