// .npy files: round trips, NumPy's exact header layout, and clear errors on bad files.
// (No differentiable code here, so no gradcheck.)
#include "check.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/npy.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("relgrad_test_" + name)).string();
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A file as NumPy writes it: magic, version 1.0, header length, the padded header, the data.
std::string npy_file(const std::string& dict, const std::string& data) {
    std::string header = dict;
    header.append(63 - (10 + header.size()) % 64, ' ');
    header.push_back('\n');
    return std::string("\x93NUMPY\x01\x00", 8) + char(header.size() & 0xff) + char(header.size() >> 8) + header + data;
}

}  // namespace

TEST_CASE("tensors round-trip through .npy in every dtype and rank") {
    const std::string path = temp_path("roundtrip.npy");
    const std::vector<Tensor> tensors = {
        f64({1.5, -2, 3e300, 4, 5, 6}, {2, 3}),
        from_vector({1.25, -7}, {2}, DType::float32),
        scalar(3.5, DType::float64),
        from_vector({5, -6, 7}, {3, 1}, DType::int64),
        from_vector({1, 0, 1}, {3}, DType::boolean),
        zeros({0, 4}, DType::float32),
    };
    for (const Tensor& t : tensors) {
        save_npy(t, path);
        const Tensor back = load_npy(path);
        CHECK(back.shape() == t.shape());
        CHECK(back.dtype() == t.dtype());
        CHECK(back.to_vector() == t.to_vector());
    }
    save_npy(f64({1, 2, 3, 4}, {2, 2}).transpose(0, 1), path);  // saved in C order of the view
    CHECK(load_npy(path).to_vector() == std::vector<double>{1, 3, 2, 4});
    std::remove(path.c_str());
}

TEST_CASE("the header is byte for byte what NumPy writes") {
    const std::string path = temp_path("header.npy");
    save_npy(zeros({2, 3}, DType::float64), path);
    const std::string bytes = read_bytes(path);
    CHECK(bytes == npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", std::string(48, '\0')));
    save_npy(zeros({3}, DType::float32), path);
    CHECK(read_bytes(path) ==
          npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(12, '\0')));
    save_npy(scalar(0, DType::int64), path);
    CHECK(read_bytes(path) ==
          npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", std::string(8, '\0')));
    std::remove(path.c_str());
}

TEST_CASE("files written by NumPy load") {
    const std::string path = temp_path("numpy.npy");
    const double values[2] = {0.5, -1.5};
    write_bytes(path, npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                               std::string(reinterpret_cast<const char*>(values), 16)));
    const Tensor t = load_npy(path);
    CHECK(t.shape() == Shape{2});
    check_values(t, {0.5, -1.5});
    std::remove(path.c_str());
}

TEST_CASE("corrupt and unsupported files give errors that name the file and the problem") {
    const std::string path = temp_path("bad.npy");
    auto error_of = [&](const std::string& bytes) {
        write_bytes(path, bytes);
        try {
            load_npy(path);
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    CHECK(error_of(npy_file(dict, std::string(16, '\0'))) == "no error");
    CHECK(error_of("hello") == path + ": not a .npy file (bad magic)");
    CHECK(error_of(npy_file(dict, std::string(12, '\0'))) ==
          path + ": truncated data: shape [2, 2] float32 needs 16 bytes, the file has 12");
    CHECK(error_of(npy_file(dict, std::string(20, '\0'))) ==
          path + ": corrupt file: extra bytes after the 16 data bytes of shape [2, 2]");
    CHECK(error_of(npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')))
              .find("unsupported dtype '<i4'") != std::string::npos);
    CHECK(error_of(npy_file("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')))
              .find("unsupported dtype '>f8'") != std::string::npos);
    CHECK(error_of(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')))
              .find("Fortran-order arrays are not supported") != std::string::npos);
    CHECK(error_of(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", std::string(16, '\0')))
              .find("bad dimension") != std::string::npos);
    CHECK(error_of(npy_file("{'descr': '<f4', 'fortran_order': False, }", "")).find("no 'shape'") != std::string::npos);
    CHECK(error_of(std::string("\x93NUMPY\x01\x00\x50", 9)) == path + ": truncated .npy header");
    CHECK(error_of(npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", "\x07")) ==
          path + ": corrupt bool data: byte 7");
    std::remove(path.c_str());
    CHECK_THROWS_WITH_AS(load_npy(path), (path + ": cannot open file").c_str(), std::runtime_error);
}

TEST_CASE("shapes that do not fit the file are rejected before anything is allocated") {
    const std::string path = temp_path("huge.npy");
    auto error_of = [&](const std::string& dict, const std::string& data) {
        write_bytes(path, npy_file(dict, data));
        try {
            load_npy(path);
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(error_of("{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000,), }", std::string(8, '\0')) ==
          path + ": truncated data: shape [100000000000] float64 needs 800000000000 bytes, the file has 8");
    CHECK(
        error_of("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 6148914691236517206), }", std::string(8, '\0'))
            .find("has too many elements") != std::string::npos);
    // no element, yet strides beyond int64
    CHECK(error_of("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296, 2), }", "") ==
          path + ": shape [0, 4294967296, 4294967296, 2] is too large: its strides overflow int64");
    CHECK(error_of("{'descr': '<f8', 'fortran_order': Maybe, 'shape': (1,), }", std::string(8, '\0')) ==
          path + ": corrupt .npy header: 'fortran_order' is not True or False");
    CHECK(error_of("{'descr': <f4, 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'))
              .find("'descr' is not a quoted string") != std::string::npos);
    std::remove(path.c_str());
}
