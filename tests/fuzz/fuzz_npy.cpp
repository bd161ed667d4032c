// fuzz_npy: the input, byte for byte, is a .npy file handed to relgrad::load_npy (engine/npy.hpp).
// A file load_npy refuses must be refused with a std::exception (std::runtime_error naming the
// file); one it accepts is written back with save_npy and read again, and must come back with the
// same dtype, shape and bytes.
// Seeds (corpus/npy/): valid files of every dtype and format version 1-3, 0-d, empty and
// multi-dimensional arrays, and slightly broken ones (truncated, extra bytes, bad magic, Fortran
// order, unknown dtype, bad shape, bool bytes above 1, a header length past the end).
#include <cstring>
#include <exception>

#include "engine/npy.hpp"
#include "fuzz_common.hpp"

using namespace relgrad_fuzz;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    single_thread();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const fs::path in = scratch_dir("npy") / "input.npy", out = scratch_dir("npy") / "again.npy";
    write_file(in, std::string_view(reinterpret_cast<const char*>(data), size));
    relgrad::Tensor tensor;
    try {
        tensor = relgrad::load_npy(in.string());
    } catch (const std::exception&) {
        return 0;  // refused, as it may be
    }
    // accepted: it must survive save_npy and a second load_npy unchanged
    relgrad::Tensor again;
    try {
        relgrad::save_npy(tensor, out.string());
        again = relgrad::load_npy(out.string());
    } catch (const std::exception& e) {
        finding(std::string("an accepted .npy file does not round-trip through save_npy: ") + e.what());
    }
    if (again.dtype() != tensor.dtype() || again.shape() != tensor.shape()) {
        finding("save_npy + load_npy changed " + std::string(relgrad::dtype_name(tensor.dtype())) + " " +
                relgrad::shape_str(tensor.shape()) + " into " + relgrad::dtype_name(again.dtype()) + " " +
                relgrad::shape_str(again.shape()));
    }
    const std::size_t nbytes = static_cast<std::size_t>(tensor.numel()) * relgrad::dtype_size(tensor.dtype());
    if (nbytes > 0 && std::memcmp(tensor.storage()->data(), again.storage()->data(), nbytes) != 0) {
        finding("save_npy + load_npy changed the data of " + relgrad::shape_str(tensor.shape()));
    }
    return 0;
}
