// relgrad: NumPy .npy files, so tensors can cross to NumPy/PyTorch without relgrad's code.
// Reads every NumPy numeric dtype, little- or big-endian, in C or Fortran order (format versions
// 1.0, 2.0, 3.0), into what the engine holds: bool stays bool, int8..int64 and uint8..uint64
// become int64 (a uint64 above 2^63 - 1 is an error), float16, float32 and float64 stay. The
// header must be the dict NumPy writes, with exactly the keys 'descr', 'fortran_order' and
// 'shape'. Writes version 1.0 in C order: '<f2', '<f4', '<f8', '<i8' or '|b1'; NumPy has no
// bfloat16, so a bfloat16 tensor is written as '<f4', float32 holding its values exactly (and
// reads back as float32).
// A directory, a corrupt, truncated or unsupported file throws std::runtime_error naming the file.
#pragma once

#include <string>

#include "engine/tensor.hpp"

namespace relgrad {

Tensor load_npy(const std::string& path);
// load_npy for where floats belong: a file of another type is refused right after its header,
// named by NumPy's name for it, `what` first: "x.npy: int32 values, expected float16, float32 or
// float64" (not the int64 the engine would hold it as).
Tensor load_npy_floats(const std::string& path, const std::string& what = "");
void save_npy(const Tensor& tensor, const std::string& path);

// A saved state (a module's parameter, an optimizer's moment): load_npy, and then a floating
// dtype with every value finite, else std::runtime_error naming the file ("a corrupt state").
Tensor load_saved_state(const std::string& path);

}  // namespace relgrad
