#include "train/run_directory.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/system.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    out.close();
    if (!out) throw std::runtime_error("could not write " + path.string());
}

}  // namespace

json read_json_file(const fs::path& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument(path.string() + ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw std::invalid_argument(path.string() + ": not valid JSON (" + e.what() + ")");
    }
}

void write_json_file(const fs::path& path, const json& value) {
    const fs::path partial = path.string() + ".partial";
    write_text(partial, value.dump(2) + "\n");
    fs::rename(partial, path);
}

std::optional<Tokenizer> saved_tokenizer(const fs::path& run) {
    if (!fs::exists(run / "tokenizer.json")) return std::nullopt;
    const fs::path path = run / "tokenizer.json";
    std::ifstream in(path);
    std::stringstream text;  // the file as written: from_json parses and checks it
    text << in.rdbuf();
    if (!in) throw std::invalid_argument(path.string() + ": cannot read");
    try {
        return Tokenizer::from_json(text.str());
    } catch (const std::runtime_error& e) {
        throw std::invalid_argument(path.string() + ": " + e.what());
    }
}

void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, int64_t step) {
    const fs::path partial = start_replacing(dir);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    write_text(partial / "state.json", json{{"step", step}}.dump() + "\n");
    finish_replacing(dir);
}

bool recovered_checkpoint(const fs::path& run) { return recover_directory(run / "checkpoint"); }

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer) {
    if (!fs::exists(dir / "state.json")) {
        throw std::invalid_argument("--resume: no checkpoint in " + dir.string());
    }
    model.load((dir / "model").string());
    optimizer.load((dir / "optimizer").string());
    const json state = read_json_file(dir / "state.json");
    if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0) {
        throw std::invalid_argument((dir / "state.json").string() + ": no step count");
    }
    return state["step"].get<int64_t>();
}

}  // namespace relgrad
