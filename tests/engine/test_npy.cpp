// .npy files: round trips, NumPy's exact header layout, every NumPy numeric dtype in either byte
// order and in Fortran order, and clear errors on bad files and headers.
// (No differentiable code here, so no gradcheck.)
#include "test_helpers.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>

#include "engine/npy.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// One name per process, so that test runs of several build directories do not share files.
std::string temp_path(const std::string& name) {
    const std::string file = "relgrad_test_" + std::to_string(::getpid()) + "_" + name;
    return (std::filesystem::temp_directory_path() / file).string();
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

// The same in version 2.0 or 3.0, whose header length takes 4 bytes; the header is not padded.
std::string npy_file_v(int major, const std::string& header, const std::string& data) {
    const auto n = header.size();
    return std::string("\x93NUMPY", 6) + char(major) + '\0' + char(n & 0xff) + char(n >> 8 & 0xff) +
           char(n >> 16 & 0xff) + char(n >> 24) + header + data;
}

// The host's (little-endian) bytes of the values.
template <class T>
std::string bytes_of(const std::vector<T>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// The dict NumPy writes for a C-order array.
std::string dict(const std::string& descr, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}

// What load_npy says about a file of these bytes ("no error" when it loads).
std::string load_error(const std::string& path, const std::string& bytes) {
    write_bytes(path, bytes);
    try {
        load_npy(path);
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "no error";
}

Tensor load_bytes(const std::string& path, const std::string& bytes) {
    write_bytes(path, bytes);
    return load_npy(path);
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
    const Tensor t = load_bytes(path, npy_file(dict("<f8", "(2,)"), bytes_of<double>({0.5, -1.5})));
    CHECK(t.shape() == Shape{2});
    check_values(t, {0.5, -1.5});
    std::remove(path.c_str());
}

TEST_CASE("every header Python writes the same dict for loads: quotes, order, spaces, versions 2.0 and 3.0") {
    const std::string path = temp_path("header_forms.npy");
    const std::string data = bytes_of<float>({1, 2, 3, 4, 5, 6});
    const std::vector<std::string> headers = {
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
        "{'shape': (2, 3,), 'descr': '<f4', 'fortran_order': False}",
        " \t{ 'descr' :'<f4' ,\n'fortran_order':\tFalse,'shape':(\r\n2\f,3 ) , }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n\n  \n",
    };
    for (const std::string& header : headers) {
        CAPTURE(header);
        const Tensor t = load_bytes(path, npy_file(header, data));
        CHECK(t.shape() == Shape{2, 3});
        check_values(t, {1, 2, 3, 4, 5, 6});
    }
    CHECK(load_bytes(path, npy_file(dict("<f4", "(00, 3)"), "")).shape() == Shape{0, 3});  // Python reads 00 as 0
    CHECK(load_bytes(path, npy_file(dict("<f4", "( )"), bytes_of<float>({7}))).dim() == 0);
    for (int major : {2, 3}) {
        const Tensor t = load_bytes(path, npy_file_v(major, dict("<f4", "(6,)") + "\n", data));
        check_values(t, {1, 2, 3, 4, 5, 6});
    }
    std::remove(path.c_str());
}

TEST_CASE("where floats belong, a file of another type is named by its own NumPy type") {
    const std::string path = temp_path("not_floats.npy");
    for (const auto& [descr, name, size] :
         {std::tuple{"<i4", "int32", 4}, {"|i1", "int8", 1}, {"<u2", "uint16", 2}, {"|b1", "bool", 1}}) {
        CAPTURE(name);
        write_bytes(path, npy_file(dict(descr, "(2,)"), std::string(2 * size, '\0')));
        CHECK(load_npy(path).dtype() == (std::string(name) == "bool" ? DType::boolean : DType::int64));
        CHECK_THROWS_WITH_AS(load_npy_floats(path),
                             (path + ": " + name + " values, expected float16, float32 or float64").c_str(),
                             std::runtime_error);
    }
    write_bytes(path, npy_file(dict("<f2", "(2,)"), std::string(4, '\0')));
    CHECK(load_npy_floats(path).dtype() == DType::float16);
    std::remove(path.c_str());
}

TEST_CASE("a header NumPy would not read, or relgrad cannot, is refused with what was expected") {
    const std::string path = temp_path("bad_header.npy");
    const std::string four_floats = std::string(16, '\0');
    const std::string order = "'fortran_order': False";
    const std::string dimension = "expected a dimension (a decimal integer >= 0, without sign or leading zeros) at ";
    const std::string keys = " (expected 'descr', 'fortran_order', 'shape')";
    const std::string dtypes =
        " (expected a byte order '<', '>' or '=', or '|' for one byte, then b1, i1, i2, i4, i8, u1, u2, u4, u8, f2, "
        "f4 or f8, such as '<f4')";
    const std::vector<std::pair<std::string, std::string>> cases = {
        // shapes
        {dict("<f4", "(2,,2)"), dimension + "\",2), }\""},
        {dict("<f4", "(+2,+2)"), dimension + "\"+2,+2), }\""},
        {dict("<f4", "(-0,2)"), dimension + "\"-0,2), }\""},
        {dict("<f4", "(-1,2)"), dimension + "\"-1,2), }\""},
        {dict("<f4", "(2.0,)"), dimension + "\"2.0,), }\""},
        {dict("<f4", "(02,)"), dimension + "\"02,), }\""},
        {dict("<f4", "(4L,)"), dimension + "\"4L,), }\""},
        {dict("<f4", "(1_000,)"), dimension + "\"1_000,), }\""},
        {dict("<f4", "(,)"), dimension + "\",), }\""},
        {dict("<f4", "(True,)"), dimension + "\"True,), }\""},
        {dict("<f4", "(\x01,)"), dimension + "\"\\x01,), }\""},
        {dict("<f4", "(9223372036854775808,)"), "expected a dimension below 2^63 at \"9223372036854775808,), }\""},
        {dict("<f4", "(99999999999999999999999999,)"),
         "expected a dimension below 2^63 at \"99999999999999999999999999,), }\""},
        {dict("<f4", "(4)"), "'shape' (4) is a number, not a tuple: write (4,)"},
        {dict("<f4", "[2, 2]"), "expected a tuple such as (2, 3) for 'shape' at \"[2, 2], }\""},
        {dict("<f4", "(2 2)"), "expected ',' or ')' after a dimension at \"2), }\""},
        {dict("<f4", "(2, 2"), dimension + "\"}\""},  // (2, 2, }
        {"{'descr': '<f4', " + order + ", 'shape': (2, 2", "expected ',' or ')' after a dimension before its end"},
        // keys
        {"{'descr': '<f4', " + order + ", 'shape': (4,), 'extra': 1}", "unknown key \"extra\"" + keys},
        {"{'descr': '<f4', " + order + "}", "no 'shape' key" + keys},
        {"{}", "no 'descr' key" + keys},
        {"{'descr': '<f4', 'descr': '<f4', " + order + ", 'shape': (4,)}", "duplicate key 'descr'"},
        {"{'descr': '<f4' " + order + ", 'shape': (4,)}",
         "expected ',' or '}' after the value of 'descr' at \"'fortran_order': False, 'shape': (4,)}\""},
        {"{descr: '<f4'}", "expected a quoted key or '}' at \"descr: '<f4'}\""},
        {"{u'descr': '<f4'}", "expected a quoted key or '}' at \"u'descr': '<f4'}\""},
        {"{'descr' '<f4'}", "expected ':' after the key at \"'<f4'}\""},
        {"{'descr': '<f4', " + order + ", 'shape': (4,),,}", "expected a quoted key or '}' at \",}\""},
        {"[('descr', '<f4')]", "expected '{' opening the header dict at \"[('descr', '<f4')]\""},
        {"", "expected '{' opening the header dict before its end"},
        {"{'descr': '<f4', " + order + ", 'shape': (4,)",
         "expected ',' or '}' after the value of 'shape' before its end"},
        // values
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,)}",
         "expected True or False for 'fortran_order' at \"Maybe, 'shape': (4,)}\""},
        {"{'descr': '<f4', 'fortran_order': Truest, 'shape': (4,)}",
         "expected True or False for 'fortran_order' at \"Truest, 'shape': (4,)}\""},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (4,)}",
         "expected True or False for 'fortran_order' at \"0, 'shape': (4,)}\""},
        {"{'descr': <f4, " + order + ", 'shape': (4,)}",
         "expected a quoted dtype such as '<f4' at \"<f4, 'fortran_order': False, 'shape': (4,)}\""},
        {"{'descr': [('x', '<f4')], " + order + ", 'shape': (4,)}",
         "expected a quoted dtype such as '<f4' at \"[('x', '<f4')], 'fortran_order': False, 'shape': (4,)}\""},
        {"{'descr': '<f4}", "expected a string closed by ' on its line at \"'<f4}\""},
        {"{'descr': '<f4\n', " + order + ", 'shape': (4,)}",
         "expected a string closed by ' on its line at \"'<f4\\n', 'fortran_order': False, 'shape': (4,)}\""},
        {"{'descr': '<\\x66\\x34', " + order + ", 'shape': (4,)}",
         "expected a string closed by ' on its line at \"'<\\\\x66\\\\x34', 'fortran_order': False, 'shape': (4,)}\""},
        // after the dict
        {dict("<f4", "(4,)") + " x", "expected only spaces after the header dict's '}' at \"x\""},
        {dict("<f4", "(4,)") + "}", "expected only spaces after the header dict's '}' at \"}\""},
        {dict("<f4", "(4,)") + " # a comment", "expected only spaces after the header dict's '}' at \"# a comment\""},
    };
    for (const auto& [header, message] : cases) {
        CAPTURE(header);
        CHECK(load_error(path, npy_file(header, four_floats)) == path + ": corrupt .npy header: " + message);
    }
    // descr: malformed or not a numeric type relgrad reads
    for (const std::string descr : {"<f4, ", "<f3", "<U4", "|O", "<c8", "<M8[s]", "|f4", "<f16", "f4", "<?", ""}) {
        CAPTURE(descr);
        CHECK(load_error(path, npy_file(dict(descr, "(4,)"), four_floats)) ==
              path + ": unsupported dtype \"" + descr + "\"" + dtypes);
    }
    std::remove(path.c_str());
}

TEST_CASE("error messages quote at most a short excerpt of the header, on one line") {
    const std::string path = temp_path("long_header.npy");
    const std::string junk(5000, 'x');
    const std::vector<std::string> headers = {
        dict("<f4", "(4,)") + junk,
        "{'" + junk + "': 1}",
        "{'descr': '" + junk + "', 'fortran_order': False, 'shape': (4,)}",
        dict("<f4", "(" + std::string(5000, '9') + ",)"),
        dict("<f4", "(4,)") + "x" + std::string(300, '\n') + "y",
        dict("<f4", "(" + std::string(200, '1') + "\n" + ",)"),
        "{'" + std::string(500, '\x01') + "': 1}",
    };
    for (const std::string& header : headers) {
        const std::string error = load_error(path, npy_file(header, std::string(16, '\0')));
        CAPTURE(error);
        CHECK(error.size() < path.size() + 300);
        CHECK(error.rfind('"') - error.find('"') <= 70);  // the quoted part of the header
        CHECK(error.find('\n') == std::string::npos);
        CHECK(error.find("...\"") != std::string::npos);  // cut, and says so
    }
    // 65 dimensions: NumPy 2's limit is 64
    std::string ones = "(";
    for (int i = 0; i < 65; ++i) ones += "1, ";
    CHECK(load_error(path, npy_file(dict("<f4", ones + ")"), std::string(4, '\0'))) ==
          path + ": corrupt .npy header: expected at most 64 dimensions at \"1, ), }\"");
    std::remove(path.c_str());
}

TEST_CASE("integers of every size and byte order become int64") {
    const std::string path = temp_path("integers.npy");
    auto load = [&](const std::string& descr, const std::string& shape, const std::string& data) {
        const Tensor t = load_bytes(path, npy_file(dict(descr, shape), data));
        CHECK(t.dtype() == DType::int64);
        return t.to_vector();
    };
    using V = std::vector<double>;
    CHECK(load("|i1", "(4,)", std::string("\x80\x7f\xff\x00", 4)) == V{-128, 127, -1, 0});
    CHECK(load("<i1", "(1,)", "\x80") == V{-128});  // a byte order on one byte is allowed, and means nothing
    CHECK(load("|u1", "(3,)", "\xff\x80\x01") == V{255, 128, 1});
    CHECK(load("<i2", "(3,)", bytes_of<int16_t>({-32768, 32767, -2})) == V{-32768, 32767, -2});
    CHECK(load(">i2", "(2,)", std::string("\x80\x00\x01\x02", 4)) == V{-32768, 258});
    CHECK(load("<u2", "(2,)", bytes_of<uint16_t>({65535, 258})) == V{65535, 258});
    CHECK(load(">u2", "(1,)", "\xff\xfe") == V{65534});
    CHECK(load("<i4", "(2,)", bytes_of<int32_t>({-2147483647 - 1, 7})) == V{-2147483648.0, 7});
    CHECK(load(">i4", "(3,)", std::string("\x00\x00\x00\x01\xff\xff\xff\xfe\x80\x00\x00\x00", 12)) ==
          V{1, -2, -2147483648.0});
    CHECK(load("=i4", "(1,)", bytes_of<int32_t>({-5})) == V{-5});
    CHECK(load("<u4", "(1,)", bytes_of<uint32_t>({4294967295u})) == V{4294967295.0});
    CHECK(load(">u4", "(1,)", std::string("\x80\x00\x00\x01", 4)) == V{2147483649.0});
    // int64 and uint64 exactly: to_vector's doubles would round them
    write_bytes(path,
                npy_file(dict(">i8", "(2,)"), std::string("\x80\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xfe", 16)));
    Tensor t = load_npy(path);
    CHECK(t.data<int64_t>()[0] == std::numeric_limits<int64_t>::min());
    CHECK(t.data<int64_t>()[1] == -2);
    write_bytes(path, npy_file(dict("<u8", "(2,)"), bytes_of<uint64_t>({9223372036854775807u, 3})));
    t = load_npy(path);
    CHECK(t.data<int64_t>()[0] == std::numeric_limits<int64_t>::max());
    CHECK(t.data<int64_t>()[1] == 3);
    CHECK(load_error(path, npy_file(dict("<u8", "(2,)"), bytes_of<uint64_t>({1, 18446744073709551615u}))) ==
          path + ": uint64 value 18446744073709551615 does not fit in int64");
    CHECK(load_error(path, npy_file(dict(">u8", "(1,)"), std::string("\x80\0\0\0\0\0\0\0", 8))) ==
          path + ": uint64 value 9223372036854775808 does not fit in int64");
    // more elements than one chunk of the conversion: every element lands in its place
    std::vector<int16_t> many(200003);
    V expected;
    for (std::size_t i = 0; i < many.size(); ++i) {
        many[i] = static_cast<int16_t>(i * 7919 % 65536 - 32768);
        expected.push_back(many[i]);
    }
    CHECK(load("<i2", "(200003,)", bytes_of(many)) == expected);
    std::remove(path.c_str());
}

TEST_CASE("bools load as bool, from bytes 0 and 1 only") {
    const std::string path = temp_path("bools.npy");
    const Tensor t = load_bytes(path, npy_file(dict("|b1", "(3,)"), std::string("\x01\x00\x01", 3)));
    CHECK(t.dtype() == DType::boolean);
    CHECK(t.to_vector() == std::vector<double>{1, 0, 1});
    CHECK(load_error(path, npy_file(dict("|b1", "(2,)"), "\x01\x07")) == path + ": corrupt bool data: byte 7");
    std::remove(path.c_str());
}

TEST_CASE("float16 stays float16, bit for bit, with subnormals, infinities and NaN") {
    const std::string path = temp_path("float16.npy");
    // bits: 1.0, -2.5, 65504 (the largest), 2^-24 (the smallest subnormal), 1023 * 2^-24 (the largest
    // subnormal), 2^-14 (the smallest normal), 1 + 2^-10, inf, -inf, -0, NaN
    const std::vector<uint16_t> bits = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x03ff, 0x0400,
                                        0x3c01, 0x7c00, 0xfc00, 0x8000, 0x7e00};
    const std::vector<float> expected = {1.0f,
                                         -2.5f,
                                         65504.0f,
                                         std::ldexp(1.0f, -24),
                                         std::ldexp(1023.0f, -24),
                                         std::ldexp(1.0f, -14),
                                         1.0f + std::ldexp(1.0f, -10),
                                         std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity(),
                                         -0.0f};
    std::string big_endian;
    for (uint16_t b : bits) big_endian += std::string{char(b >> 8), char(b & 0xff)};
    const std::string shape = "(" + std::to_string(bits.size()) + ",)";
    for (const std::string& file :
         {npy_file(dict("<f2", shape), bytes_of(bits)), npy_file(dict(">f2", shape), big_endian)}) {
        const Tensor loaded = load_bytes(path, file);
        CHECK(loaded.dtype() == DType::float16);
        const Tensor t = loaded.to(DType::float32);
        const float* values = t.data<float>();
        for (std::size_t i = 0; i < expected.size(); ++i) {
            CAPTURE(i);
            CHECK(values[i] == expected[i]);
        }
        CHECK(std::signbit(values[9]));  // -0
        CHECK(std::isnan(values[10]));
    }
    CHECK(load_error(path, npy_file(dict("<f2", "(3,)"), std::string(2, '\0'))) ==
          path + ": truncated data: shape [3] float16 needs 6 bytes, the file has 2");
    std::remove(path.c_str());
}

TEST_CASE("float16 saves as <f2 and bfloat16 as <f4, each read back exactly") {
    const std::string path = temp_path("sixteen.npy");
    const std::vector<double> values = {1.0, -2.5, 65504.0, std::ldexp(1.0, -24), 0.1, -0.0};
    const Tensor half = from_vector(values, {2, 3}, DType::float16);
    save_npy(half, path);
    CHECK(read_bytes(path).find("'descr': '<f2'") != std::string::npos);
    const Tensor half_back = load_npy(path);
    CHECK(half_back.dtype() == DType::float16);
    CHECK(half_back.shape() == Shape{2, 3});
    CHECK(half_back.to_vector() == half.to_vector());
    const Tensor brain = from_vector(values, {6}, DType::bfloat16);
    save_npy(brain, path);
    CHECK(read_bytes(path).find("'descr': '<f4'") != std::string::npos);
    const Tensor brain_back = load_npy(path);
    CHECK(brain_back.dtype() == DType::float32);
    CHECK(brain_back.to_vector() == brain.to_vector());  // 0.1 as bfloat16 holds it, 0.10009765625
    CHECK(brain_back.to_vector()[4] == 0.10009765625);
    std::remove(path.c_str());
}

TEST_CASE("float32 and float64 load in either byte order") {
    const std::string path = temp_path("floats.npy");
    Tensor t = load_bytes(path, npy_file(dict(">f4", "(2,)"), std::string("\x3f\xc0\x00\x00\xc0\x20\x00\x00", 8)));
    CHECK(t.dtype() == DType::float32);
    check_values(t, {1.5, -2.5});
    t = load_bytes(path, npy_file(dict(">f8", "(1,)"), std::string("\xc0\x00\0\0\0\0\0\0", 8)));
    CHECK(t.dtype() == DType::float64);
    check_values(t, {-2});
    t = load_bytes(path, npy_file(dict("=f8", "(1,)"), bytes_of<double>({0.1})));
    CHECK(t.to_vector() == std::vector<double>{0.1});
    std::remove(path.c_str());
}

TEST_CASE("Fortran-order arrays load in C order") {
    const std::string path = temp_path("fortran.npy");
    const std::string header = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }";
    // [[1, 2, 3], [4, 5, 6]] column by column
    Tensor t = load_bytes(path, npy_file(header, bytes_of<double>({1, 4, 2, 5, 3, 6})));
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.is_contiguous());
    CHECK(t.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
    // [2, 3, 4] big-endian int16: element [i, j, k] is 100 i + 10 j + k, stored at i + 2 j + 6 k
    std::string data(48, '\0');
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 3; ++j) {
            for (int k = 0; k < 4; ++k) data[2 * (i + 2 * j + 6 * k) + 1] = char(100 * i + 10 * j + k);
        }
    }
    t = load_bytes(path, npy_file("{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3, 4), }", data));
    CHECK(t.shape() == Shape{2, 3, 4});
    std::vector<double> expected;
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 3; ++j) {
            for (int k = 0; k < 4; ++k) expected.push_back(100 * i + 10 * j + k);
        }
    }
    CHECK(t.to_vector() == expected);
    t = load_bytes(path,
                   npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", bytes_of<float>({1, 2, 3})));
    CHECK(t.to_vector() == std::vector<double>{1, 2, 3});
    std::remove(path.c_str());
}

TEST_CASE("corrupt and unsupported files give errors that name the file and the problem") {
    const std::string path = temp_path("bad.npy");
    const std::string dict22 = dict("<f4", "(2, 2)");
    CHECK(load_error(path, npy_file(dict22, std::string(16, '\0'))) == "no error");
    CHECK(load_error(path, "hello") == path + ": not a .npy file (bad magic)");
    CHECK(load_error(path, npy_file(dict22, std::string(12, '\0'))) ==
          path + ": truncated data: shape [2, 2] float32 needs 16 bytes, the file has 12");
    CHECK(load_error(path, npy_file(dict22, std::string(20, '\0'))) ==
          path + ": corrupt file: extra bytes after the 16 data bytes of shape [2, 2] float32");
    CHECK(load_error(path, std::string("\x93NUMPY\x01\x00\x50", 9)) == path + ": truncated .npy header");
    CHECK(load_error(path, std::string("\x93NUMPY\x01\x01\x00\x00", 10)) ==
          path + ": unsupported .npy format version (expected 1.0, 2.0 or 3.0)");
    CHECK(load_error(path, std::string("\x93NUMPY\x04\x00\x00\x00", 10)) ==
          path + ": unsupported .npy format version (expected 1.0, 2.0 or 3.0)");
    std::remove(path.c_str());
    CHECK_THROWS_WITH_AS(load_npy(path), (path + ": missing, expected a .npy file").c_str(), std::runtime_error);
    const std::string directory = temp_path("a_directory.npy");
    std::filesystem::create_directory(directory);
    CHECK_THROWS_WITH_AS(load_npy(directory), (directory + ": is a directory, expected a .npy file").c_str(),
                         std::runtime_error);
    std::filesystem::remove(directory);
    CHECK_THROWS_WITH_AS(load_npy("/dev/null"),
                         "/dev/null: not a regular file (a FIFO or a device), expected a .npy file",
                         std::runtime_error);
    const std::string loop = temp_path("loop.npy"), back = temp_path("back.npy");  // loop -> back -> loop
    std::filesystem::create_symlink(back, loop);
    std::filesystem::create_symlink(loop, back);
    CHECK_THROWS_WITH_AS(load_npy(loop), (loop + ": a loop of symbolic links, expected a .npy file").c_str(),
                         std::runtime_error);
    std::filesystem::remove(loop);
    std::filesystem::remove(back);
}

TEST_CASE("shapes that do not fit the file are rejected before anything is allocated") {
    const std::string path = temp_path("huge.npy");
    CHECK(load_error(path, npy_file(dict("<f8", "(100000000000,)"), std::string(8, '\0'))) ==
          path + ": truncated data: shape [100000000000] float64 needs 800000000000 bytes, the file has 8");
    CHECK(load_error(path, npy_file(dict("<f8", "(3, 6148914691236517206)"), std::string(8, '\0')))
              .find("has too many elements") != std::string::npos);
    CHECK(load_error(path, npy_file(dict("<f4", "(9223372036854775807,)"), "")) ==
          path + ": corrupt .npy header: shape [9223372036854775807] has too many elements");
    // no element, yet strides beyond int64
    CHECK(load_error(path, npy_file(dict("<f4", "(0, 4294967296, 4294967296, 2)"), "")) ==
          path + ": shape [0, 4294967296, 4294967296, 2] is too large: its strides overflow int64");
    std::remove(path.c_str());
}
