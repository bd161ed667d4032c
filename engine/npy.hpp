// relgrad: NumPy .npy files, so tensors can cross to NumPy/PyTorch without relgrad's code.
// Reads float32, float64, int64 and bool arrays in C order (format versions 1-3); writes
// version 1.0. Corrupt, truncated or unsupported files throw std::runtime_error naming the file.
#pragma once

#include <string>

#include "engine/tensor.hpp"

namespace relgrad {

Tensor load_npy(const std::string& path);
void save_npy(const Tensor& tensor, const std::string& path);

}  // namespace relgrad
