// relgrad layer --spec SPEC.json --in DIR --out DIR
//
// Runs one layer forward and backward on NumPy files, so that any other implementation can be
// compared with relgrad's through .npy files alone. docs/layers/README.md lists the spec of
// every layer type and the files read and written.
#pragma once

#include <string>

#include "engine/storage.hpp"

namespace relgrad {

void run_layer_command(const std::string& spec_path, const std::string& in_dir, const std::string& out_dir,
                       Device device = Device::cpu);

}  // namespace relgrad
