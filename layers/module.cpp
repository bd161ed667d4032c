#include "layers/module.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/npy.hpp"
#include "engine/system.hpp"

namespace relgrad {

namespace fs = std::filesystem;

namespace {

// a shape without memory: one zero, broadcast
Tensor shape_only(const Shape& shape, DType dtype) { return zeros(Shape(shape.size(), 1), dtype).expand(shape); }

}  // namespace

Tensor truncated_normal(const Shape& shape, double std, const Init& init) {
    if (init.shapes_only) return shape_only(shape, init.dtype);
    std::vector<double> values = host_values(shape, init.dtype);
    for (double& v : values) {
        do v = init.gen.next_normal();
        while (std::fabs(v) > 2.0);
        v *= std;
    }
    return from_vector(values, shape, init.dtype);
}

Tensor xavier_uniform(const Shape& shape, const Init& init) {
    RELGRAD_CHECK(shape.size() == 2, "xavier_uniform: needs a [fan_out, fan_in] shape");
    if (init.shapes_only) return shape_only(shape, init.dtype);
    const double bound = std::sqrt(6.0 / static_cast<double>(shape[0] + shape[1]));
    std::vector<double> values = host_values(shape, init.dtype);
    for (double& v : values) v = (2 * init.gen.next_uniform() - 1) * bound;
    return from_vector(values, shape, init.dtype);
}

Tensor& Module::register_parameter(const std::string& name, Tensor& slot, Tensor value) {
    slot = value.detach().requires_grad_(true);
    parameters_.emplace_back(name, &slot);
    return slot;
}

void Module::register_module(const std::string& name, Module& child) { children_.emplace_back(name, &child); }

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out) const {
    for (const auto& [name, slot] : parameters_) out.emplace_back(prefix + name, slot);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
    std::vector<std::pair<std::string, Tensor*>> slots;
    collect("", slots);
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [name, slot] : slots) out.emplace_back(name, *slot);
    return out;
}

std::vector<Tensor> Module::parameters() const {
    std::vector<Tensor> out;
    for (const auto& named : named_parameters()) out.push_back(named.second);
    return out;
}

int64_t Module::parameter_count() const {
    int64_t count = 0;
    for (const Tensor& p : parameters()) count += p.numel();
    return count;
}

void Module::train(bool training) {
    training_ = training;
    for (const auto& child : children_) child.second->train(training);
}

void Module::collect_generators(std::vector<Generator*>& out) {
    own_generators(out);
    for (const auto& child : children_) child.second->collect_generators(out);
}

std::vector<Generator> Module::random_state() {
    std::vector<Generator*> generators;
    collect_generators(generators);
    std::vector<Generator> state;
    for (const Generator* gen : generators) state.push_back(*gen);
    return state;
}

void Module::set_random_state(const std::vector<Generator>& state) {
    std::vector<Generator*> generators;
    collect_generators(generators);
    RELGRAD_CHECK(generators.size() == state.size(), "set_random_state: ", state.size(), " streams for a module with ",
                  generators.size());
    for (std::size_t i = 0; i < state.size(); ++i) *generators[i] = state[i];
}

void Module::reseed(uint64_t seed) {
    Generator derive(seed);
    for (const auto& child : children_) child.second->reseed(derive.next_u64());
}

void Module::zero_grad() {
    for (Tensor p : parameters()) p.zero_grad();
}

void Module::assign_parameters(const std::vector<Tensor>& values) {
    std::vector<std::pair<std::string, Tensor*>> slots;
    collect("", slots);
    RELGRAD_CHECK(values.size() == slots.size(), "assign_parameters: ", values.size(), " tensors given for ",
                  slots.size(), " parameters");
    for (std::size_t i = 0; i < slots.size(); ++i) {
        RELGRAD_CHECK(values[i].shape() == slots[i].second->shape(), "assign_parameters: ", slots[i].first,
                      " needs shape ", shape_str(slots[i].second->shape()), ", got ", shape_str(values[i].shape()));
        *slots[i].second = values[i];
    }
}

ComputeIn::ComputeIn(Module& module, DType dtype) : module_(module) {
    if (dtype == DType::float32) return;
    masters_ = module.parameters();
    std::vector<Tensor> casts;
    for (const Tensor& master : masters_) casts.push_back(master.dtype() == DType::float32 ? master.to(dtype) : master);
    module.assign_parameters(casts);
}

ComputeIn::~ComputeIn() {
    if (!masters_.empty()) module_.assign_parameters(masters_);  // same shapes: cannot throw
}

void Module::to(DType dtype) {
    std::vector<std::pair<std::string, Tensor*>> slots;
    collect("", slots);
    NoGradGuard no_grad;
    for (auto& [name, slot] : slots) *slot = slot->to(dtype).detach().requires_grad_(true);
}

// Each parameter keeps its identity (its TensorImpl, which an optimizer may hold): only its
// storage is replaced by a packed copy on the device, and its gradient dropped.
void Module::to(Device device) {
    NoGradGuard no_grad;
    for (auto& [name, slot] : parameters_) {
        if (slot->device() == device) continue;
        const Tensor moved = slot->to(device);
        TensorImpl& impl = *slot->impl();
        impl.storage = moved.storage();
        impl.strides = moved.strides();
        impl.offset = moved.offset();
        impl.grad = Tensor();
    }
    for (auto& [name, child] : children_) child->to(device);
}

Device Module::device() const {
    const auto parameters = named_parameters();
    return parameters.empty() ? Device::cpu : parameters.front().second.device();
}

void Module::save(const std::string& dir) const {
    const fs::path target(dir);
    const fs::path partial = start_replacing(target);
    nlohmann::json manifest = {{"format", "relgrad-state"}, {"version", 1}, {"parameters", nlohmann::json::array()}};
    for (const auto& [name, tensor] : named_parameters()) {
        save_npy(tensor, (partial / (name + ".npy")).string());
        manifest["parameters"].push_back({{"name", name},
                                          {"file", name + ".npy"},
                                          {"shape", tensor.shape()},
                                          {"dtype", dtype_name(tensor.dtype())}});
    }
    std::ofstream manifest_file(partial / "manifest.json");
    manifest_file << manifest.dump(2) << "\n";
    manifest_file.close();
    RELGRAD_CHECK_RUNTIME(manifest_file, "Module::save: could not write ", (partial / "manifest.json").string());
    finish_replacing(target);  // the old directory is removed only once the new one is in place
}

void Module::load(const std::string& dir) {
    const fs::path manifest_path = fs::path(dir) / "manifest.json";
    const std::string where = manifest_path.string();
    nlohmann::json manifest;
    try {
        manifest = nlohmann::json::parse(
            read_file(manifest_path, "a saved state's manifest.json (is " + dir + " a directory Module.save wrote?)"));
    } catch (const nlohmann::json::exception& e) {
        throw std::invalid_argument(where + ": not valid JSON: " + e.what());
    }
    // what save() writes, and nothing else: a field that is written is checked
    RELGRAD_CHECK(manifest.is_object() && manifest.size() == 3 &&
                      manifest.value("format", nlohmann::json()) == "relgrad-state" && manifest.contains("version") &&
                      manifest.contains("parameters") && manifest["parameters"].is_array(),
                  where, ": expected {\"format\": \"relgrad-state\", \"version\": 1, \"parameters\": [...]}");
    RELGRAD_CHECK(manifest["version"] == 1, where, ": version ", manifest["version"].dump(),
                  ", this relgrad reads version 1");
    struct Listed {
        Shape shape;
        DType dtype;
    };
    std::map<std::string, Listed> listed;
    for (const nlohmann::json& entry : manifest["parameters"]) {
        const auto text = [&entry](const char* key) {
            return entry.contains(key) && entry[key].is_string() ? entry[key].get<std::string>() : std::string();
        };
        const std::string name = text("name");
        RELGRAD_CHECK(entry.is_object() && entry.size() == 4 && !name.empty() && entry.contains("shape"), where,
                      ": a parameter is {\"name\", \"file\", \"shape\", \"dtype\"}, got ", entry.dump());
        // the file is the one save() names after the parameter: nothing else is read
        RELGRAD_CHECK(text("file") == name + ".npy", where, ": parameter '", name, "': file must be '", name, ".npy'");
        // sizes are whole numbers that int64_t holds (converting 1e30 or 2^64 to one is undefined);
        // parsed JSON keeps every integer >= 0 as an unsigned one
        const auto is_size = [](const nlohmann::json& n) {
            return n.is_number_unsigned() && n.get<std::uint64_t>() <= std::uint64_t{INT64_MAX};
        };
        const nlohmann::json& shape = entry["shape"];
        RELGRAD_CHECK(shape.is_array() && std::all_of(shape.begin(), shape.end(), is_size), where, ": parameter '",
                      name, "': shape must be a list of sizes (whole numbers >= 0)");
        const std::optional<DType> dtype = value_named(floating_dtype_names, text("dtype"));
        RELGRAD_CHECK(dtype, where, ": parameter '", name, "': dtype must be one of ",
                      names_in_words(floating_dtype_names), ", got ", entry.value("dtype", nlohmann::json()).dump());
        const bool first_listing = listed.emplace(name, Listed{shape.get<Shape>(), *dtype}).second;
        RELGRAD_CHECK(first_listing, where, ": parameter '", name, "' is listed twice");
    }
    std::vector<std::pair<std::string, Tensor*>> slots;
    collect("", slots);
    // check everything before changing anything
    std::vector<Tensor> loaded;
    for (const auto& [name, slot] : slots) {
        const auto found = listed.find(name);
        RELGRAD_CHECK(found != listed.end(), where, ": no saved value for the model's parameter '", name, "'");
        const Listed& entry = found->second;
        RELGRAD_CHECK(entry.shape == slot->shape(), where, ": parameter '", name, "' has shape ",
                      shape_str(entry.shape), ", the model's is ", shape_str(slot->shape()));
        const fs::path file = fs::path(dir) / (name + ".npy");
        Tensor value;
        try {
            value = load_saved_state(file.string());
        } catch (const std::runtime_error& e) {  // a file of the state: bad input as the manifest is
            throw std::invalid_argument(e.what());
        }
        // bfloat16 is saved as float32 (NumPy has no bfloat16), exactly
        const DType stored = entry.dtype == DType::bfloat16 ? DType::float32 : entry.dtype;
        RELGRAD_CHECK(value.shape() == entry.shape && value.dtype() == stored, file.string(), ": holds ",
                      shape_str(value.shape()), " ", dtype_name(value.dtype()), ", ", where, " lists ",
                      shape_str(entry.shape), " ", dtype_name(entry.dtype));
        loaded.push_back(value);
        listed.erase(found);
    }
    RELGRAD_CHECK(listed.empty(), where, ": saved parameter '", listed.begin()->first, "' is not in the model");
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < slots.size(); ++i) {
        Tensor& slot = *slots[i].second;
        slot.copy_(loaded[i]);  // converted to the parameter's dtype and copied to its device
    }
}

}  // namespace relgrad
