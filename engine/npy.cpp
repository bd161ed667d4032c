// The .npy layout: the magic "\x93NUMPY", a version (major, minor), the header length (2 bytes
// little-endian in version 1, 4 bytes in versions 2 and 3), the header -- a Python dict literal
// such as {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
// newline -- and then the raw elements.
#include "engine/npy.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "engine/backend/backend.hpp"
#include "engine/system.hpp"

namespace relgrad {

namespace {

const char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMaxDims = 64;       // NumPy's own limit (NPY_MAXDIMS in NumPy 2)
constexpr std::size_t kExcerptChars = 60;  // how much of the header an error message quotes

std::runtime_error npy_error(const std::string& path, const std::string& what) {
    return std::runtime_error(path + ": " + what);
}

// text[from...] in double quotes for an error message: about kExcerptChars characters, on one
// line (newlines and other unprintable bytes written as \n, \xNN), "..." when cut.
std::string excerpt(const std::string& text, std::size_t from = 0) {
    std::string out;
    std::size_t i = from;
    for (; i < text.size() && out.size() < kExcerptChars; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '"' || c == '\\') {
            out += std::string("\\") + static_cast<char>(c);
        } else if (c < 0x20 || c >= 0x7f) {
            const char hex[] = "0123456789abcdef";
            out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
        } else {
            out += static_cast<char>(c);
        }
    }
    return "\"" + out + (i < text.size() ? "...\"" : "\"");
}

// The element type that 'descr' names: a byte order, a kind and a size in bytes, such as '<f4'.
struct ElementType {
    char kind;  // 'b' bool, 'i' signed integer, 'u' unsigned integer, 'f' floating point
    int size;
    bool big_endian;
};

// '<' little-endian, '>' big-endian, '=' the machine's order (little-endian: save_npy assumes it
// too), '|' no order (one-byte types only); then b1, i1/2/4/8, u1/2/4/8 or f2/4/8.
ElementType element_type(const std::string& descr, const std::string& path) {
    const std::string known[] = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"};
    const bool known_type =
        descr.size() == 3 && std::find(std::begin(known), std::end(known), descr.substr(1)) != std::end(known);
    const bool known_order =
        known_type && (std::string("<>=").find(descr[0]) != std::string::npos || (descr[0] == '|' && descr[2] == '1'));
    if (!known_order) {
        throw npy_error(path, "unsupported dtype " + excerpt(descr) +
                                  " (expected a byte order '<', '>' or '=', or '|' for one byte, then b1, i1, i2, "
                                  "i4, i8, u1, u2, u4, u8, f2, f4 or f8, such as '<f4')");
    }
    return ElementType{descr[1], descr[2] - '0', descr[0] == '>'};
}

// NumPy's name of the type: bool, int8, uint64, float16...
std::string type_name(const ElementType& type) {
    if (type.kind == 'b') return "bool";
    return (type.kind == 'i' ? "int" : type.kind == 'u' ? "uint" : "float") + std::to_string(8 * type.size);
}

// What the engine holds: bool stays bool, every integer becomes int64, the floats stay.
DType engine_dtype(const ElementType& type) {
    if (type.kind == 'b') return DType::boolean;
    if (type.kind == 'f') return type.size == 8 ? DType::float64 : type.size == 4 ? DType::float32 : DType::float16;
    return DType::int64;
}

const char* descr_of(DType dtype) {
    switch (dtype) {
        case DType::float32: return "<f4";
        case DType::float64: return "<f8";
        case DType::int64: return "<i8";
        case DType::boolean: return "|b1";
        case DType::float16: return "<f2";
        case DType::bfloat16: return "<f4";  // NumPy has no bfloat16: written as float32 (exactly)
    }
    return "";
}

struct Header {
    ElementType type;
    bool fortran_order;
    Shape shape;
};

// Reads the header, the Python dict literal that NumPy writes:
//   header := space* '{' (entry (',' entry)* ','?)? '}' space*      (space: ' ' \t \f \r \n)
//   entry  := 'descr' ':' string | 'fortran_order' ':' (True | False) | 'shape' ':' tuple
//   tuple  := '(' ')' | '(' dim ',' ')' | '(' dim (',' dim)+ ','? ')'
// with each key exactly once, strings in '...' or "..." on one line without escapes, and space
// allowed between any two tokens. A dim is a decimal integer below 2^63 without sign or leading
// zero. This refuses all that NumPy refuses, and a few spellings that Python accepts but NumPy
// never writes: signs, duplicate keys, comments, line continuations, escapes, string prefixes and
// concatenation, and integers such as 1_000 or 0x10. No recursion: the grammar is flat.
class HeaderParser {
public:
    HeaderParser(const std::string& text, const std::string& path) : text_(text), path_(path) {}

    Header parse() {
        bool seen_descr = false, seen_order = false, seen_shape = false;
        Header header{};
        expect('{', "'{' opening the header dict");
        while (!accept('}')) {
            const std::string key = quoted("a quoted key or '}'");
            expect(':', "':' after the key");
            if (key == "descr") {
                mark_seen(seen_descr, key);
                header.type = element_type(quoted("a quoted dtype such as '<f4'"), path_);
            } else if (key == "fortran_order") {
                mark_seen(seen_order, key);
                header.fortran_order = boolean();
            } else if (key == "shape") {
                mark_seen(seen_shape, key);
                header.shape = shape_tuple();
            } else {
                throw error("unknown key " + excerpt(key) + " (expected 'descr', 'fortran_order', 'shape')");
            }
            if (!accept(',')) {
                expect('}', "',' or '}' after the value of '" + key + "'");
                break;
            }
        }
        skip_space();
        if (pos_ != text_.size()) fail("only spaces after the header dict's '}'");
        const char* missing = !seen_descr ? "descr" : !seen_order ? "fortran_order" : !seen_shape ? "shape" : nullptr;
        if (missing) throw error(std::string("no '") + missing + "' key (expected 'descr', 'fortran_order', 'shape')");
        return header;
    }

private:
    std::runtime_error error(const std::string& what) const { return npy_error(path_, "corrupt .npy header: " + what); }

    [[noreturn]] void fail(const std::string& expected) const {
        throw error("expected " + expected + (pos_ < text_.size() ? " at " + excerpt(text_, pos_) : " before its end"));
    }

    void mark_seen(bool& seen, const std::string& key) const {
        if (seen) throw error("duplicate key '" + key + "'");
        seen = true;
    }

    void skip_space() {
        auto space = [](char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\r' || c == '\n'; };
        while (pos_ < text_.size() && space(text_[pos_])) ++pos_;
    }

    bool accept(char c) {  // consumes c, after any space, when it comes next
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }

    void expect(char c, const std::string& what) {
        if (!accept(c)) fail(what);
    }

    // True and False are whole words: "Truest" is a name, not a bool.
    bool word(const std::string& w) {
        const std::size_t end = pos_ + w.size();
        if (text_.compare(pos_, w.size(), w) != 0) return false;
        if (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) {
            return false;
        }
        pos_ = end;
        return true;
    }

    bool boolean() {
        skip_space();
        if (word("True")) return true;
        if (word("False")) return false;
        fail("True or False for 'fortran_order'");
    }

    std::string quoted(const std::string& what) {
        skip_space();
        if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail(what);
        const char quote = text_[pos_];
        const std::size_t start = pos_;
        std::size_t end = start + 1;
        while (end < text_.size() && text_[end] != quote && text_[end] != '\\' && text_[end] != '\n') ++end;
        if (end >= text_.size() || text_[end] != quote)
            fail(std::string("a string closed by ") + quote + " on its line");
        pos_ = end + 1;
        return text_.substr(start + 1, end - start - 1);
    }

    Shape shape_tuple() {
        expect('(', "a tuple such as (2, 3) for 'shape'");
        Shape shape;
        while (!accept(')')) {
            if (shape.size() == kMaxDims) fail("at most " + std::to_string(kMaxDims) + " dimensions");
            shape.push_back(dimension());
            if (accept(',')) continue;
            expect(')', "',' or ')' after a dimension");
            if (shape.size() == 1) {  // Python reads (3) as the number 3
                throw error("'shape' (" + std::to_string(shape[0]) + ") is a number, not a tuple: write (" +
                            std::to_string(shape[0]) + ",)");
            }
            break;
        }
        return shape;
    }

    // Digit by digit, so that a huge value is an error and never an overflow.
    int64_t dimension() {
        skip_space();
        const std::size_t start = pos_;
        auto digit_at = [&](std::size_t i) { return i < text_.size() && text_[i] >= '0' && text_[i] <= '9'; };
        int64_t value = 0;
        while (digit_at(pos_)) {
            const int digit = text_[pos_] - '0';
            if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
                pos_ = start;
                fail("a dimension below 2^63");
            }
            value = value * 10 + digit;
            ++pos_;
        }
        const std::size_t digits = pos_ - start;
        // Python reads 0 and 00 as zero but refuses 02; 2.0, 2L, 1e3, 0x10 or 1_000 are not plain digits.
        const bool leading_zero = digits > 1 && text_[start] == '0' && value != 0;
        const bool more = pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                                  text_[pos_] == '.' || text_[pos_] == '_');
        if (digits == 0 || leading_zero || more) {
            pos_ = start;
            fail("a dimension (a decimal integer >= 0, without sign or leading zeros)");
        }
        return value;
    }

    const std::string& text_;
    const std::string& path_;
    std::size_t pos_ = 0;
};

// One element's bytes as an unsigned number, in the file's byte order.
uint64_t element_bits(const unsigned char* bytes, const ElementType& type) {
    uint64_t bits = 0;
    for (int i = 0; i < type.size; ++i) bits = bits << 8 | bytes[type.big_endian ? i : type.size - 1 - i];
    return bits;
}

// Two's complement of `size` bytes: a negative n is stored as the bits of ~(-n - 1).
int64_t signed_value(uint64_t bits, int size) {
    const uint64_t sign_bit = uint64_t{1} << (8 * size - 1);
    if ((bits & sign_bit) == 0) return static_cast<int64_t>(bits);
    return -static_cast<int64_t>(~bits & (sign_bit - 1)) - 1;
}

// float16: 1 sign bit, 5 exponent bits e (bias 15), 10 mantissa bits m. Every float16 is exactly
// a float32: e = 0 is m * 2^-24 (zero and the subnormals), e = 31 is inf (m = 0) or NaN, and
// otherwise the value is (1024 + m) * 2^(e - 25) = (1 + m/1024) * 2^(e - 15).
// Reads the tensor's elements from the file, converting each from the file's type to the
// tensor's dtype (engine_dtype). A chunk at a time, so a big file is never held twice.
void read_elements(std::ifstream& in, const ElementType& type, Tensor& tensor, const std::string& path) {
    constexpr int64_t kChunkElements = 1 << 16;
    const int64_t count = tensor.numel();
    void* out = tensor.storage()->data();
    // little-endian float16, float32, float64 and int64 are already what the engine holds: read them
    // straight into the tensor, ten times as fast as converting
    const bool engine_layout = !type.big_endian && (type.kind == 'f' || type.kind == 'i') &&
                               type.size == static_cast<int>(dtype_size(tensor.dtype()));
    if (engine_layout) {
        if (!in.read(static_cast<char*>(out), static_cast<std::streamsize>(count * type.size))) {
            throw npy_error(path, "read failed");
        }
        return;
    }
    std::vector<unsigned char> chunk;
    for (int64_t start = 0; start < count; start += kChunkElements) {
        const int64_t n = std::min(kChunkElements, count - start);
        chunk.resize(static_cast<std::size_t>(n * type.size));
        if (!in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()))) {
            throw npy_error(path, "read failed");
        }
        for (int64_t i = 0; i < n; ++i) {
            const uint64_t bits = element_bits(&chunk[static_cast<std::size_t>(i * type.size)], type);
            const int64_t at = start + i;
            if (type.kind == 'b') {
                if (bits > 1) throw npy_error(path, "corrupt bool data: byte " + std::to_string(bits));
                static_cast<bool*>(out)[at] = bits == 1;
            } else if (type.kind == 'i') {
                static_cast<int64_t*>(out)[at] = signed_value(bits, type.size);
            } else if (type.kind == 'u') {
                if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                    throw npy_error(path, "uint64 value " + std::to_string(bits) + " does not fit in int64");
                }
                static_cast<int64_t*>(out)[at] = static_cast<int64_t>(bits);
            } else if (type.size == 2) {
                static_cast<uint16_t*>(out)[at] = static_cast<uint16_t>(bits);  // float16 as it is
            } else if (type.size == 4) {
                const auto bits32 = static_cast<uint32_t>(bits);
                std::memcpy(static_cast<float*>(out) + at, &bits32, 4);
            } else {
                std::memcpy(static_cast<double*>(out) + at, &bits, 8);
            }
        }
    }
}

}  // namespace

namespace {

Tensor read_npy(const std::string& path, const std::string* refuse_non_floats_as) {
    try {
        require_regular_file(path, "a .npy file");
    } catch (const std::invalid_argument& e) {  // a file error, as every other of this reader
        throw std::runtime_error(e.what());
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw npy_error(path, "cannot open file");
    char magic[6];
    unsigned char version[2];
    if (!in.read(magic, 6) || std::memcmp(magic, kMagic, 6) != 0) throw npy_error(path, "not a .npy file (bad magic)");
    if (!in.read(reinterpret_cast<char*>(version), 2) || version[0] < 1 || version[0] > 3 || version[1] != 0) {
        throw npy_error(path, "unsupported .npy format version (expected 1.0, 2.0 or 3.0)");
    }
    unsigned char length_bytes[4] = {0, 0, 0, 0};
    const int length_size = version[0] == 1 ? 2 : 4;
    if (!in.read(reinterpret_cast<char*>(length_bytes), length_size)) throw npy_error(path, "truncated .npy header");
    const uint32_t header_length =
        length_bytes[0] | length_bytes[1] << 8 | length_bytes[2] << 16 | static_cast<uint32_t>(length_bytes[3]) << 24;
    if (header_length > (1u << 20))
        throw npy_error(path, "corrupt .npy header (length " + std::to_string(header_length) + ")");
    std::string text(header_length, '\0');
    if (!in.read(text.data(), header_length)) throw npy_error(path, "truncated .npy header");
    text.erase(text.find_last_not_of(" \t\f\r\n") + 1);  // the padding, so that no message quotes it
    const Header header = HeaderParser(text, path).parse();
    if (refuse_non_floats_as && header.type.kind != 'f') {
        throw npy_error(
            path, *refuse_non_floats_as + type_name(header.type) + " values, expected float16, float32 or float64");
    }
    const DType dtype = engine_dtype(header.type);
    int64_t count = 0;
    try {
        count = shape_numel(header.shape);
    } catch (const std::invalid_argument& e) {
        throw npy_error(path, std::string("corrupt .npy header: ") + e.what());
    }

    // compare with the file's size before allocating anything
    const std::streamoff data_start = in.tellg();
    in.seekg(0, std::ios::end);
    const auto available = static_cast<uint64_t>(in.tellg() - data_start);
    in.seekg(data_start);
    const uint64_t nbytes = static_cast<uint64_t>(count) * static_cast<uint64_t>(header.type.size);
    const std::string described = "shape " + shape_str(header.shape) + " " + type_name(header.type);
    if (available < nbytes) {
        throw npy_error(path, "truncated data: " + described + " needs " + std::to_string(nbytes) +
                                  " bytes, the file has " + std::to_string(available));
    }
    if (available > nbytes) {
        throw npy_error(
            path, "corrupt file: extra bytes after the " + std::to_string(nbytes) + " data bytes of " + described);
    }
    // A Fortran-order array is its C-order transpose: read it with the shape reversed, then
    // reverse the dims back and lay it out in C order.
    Shape stored = header.shape;
    if (header.fortran_order) std::reverse(stored.begin(), stored.end());
    Tensor tensor;  // on the host; to(device) moves it
    try {
        tensor = empty(stored, dtype);
    } catch (const std::invalid_argument& e) {  // a shape whose strides would overflow
        throw npy_error(path, e.what());
    }
    read_elements(in, header.type, tensor, path);
    if (!header.fortran_order || tensor.dim() < 2) return tensor;
    std::vector<int64_t> reversed(static_cast<std::size_t>(tensor.dim()));
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    return tensor.permute(reversed).contiguous();
}

}  // namespace

Tensor load_npy(const std::string& path) { return read_npy(path, nullptr); }
Tensor load_npy_floats(const std::string& path, const std::string& what) { return read_npy(path, &what); }

void save_npy(const Tensor& tensor, const std::string& path) {
    Tensor packed = tensor.detach().to(Device::cpu).contiguous();  // a host copy of a device tensor
    if (packed.dtype() == DType::bfloat16) packed = packed.to(DType::float32);
    std::string shape;  // a Python tuple: (), (3,), (2, 3)
    for (int64_t s : packed.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
    shape = "(" + shape + (packed.dim() == 1 ? ",)" : ")");
    std::string header =
        std::string("{'descr': '") + descr_of(packed.dtype()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
    // pad so that magic + version + length + header is a multiple of 64 bytes, ending in '\n'
    const std::size_t preamble = 6 + 2 + 2;
    header.append(63 - (preamble + header.size()) % 64, ' ');
    header.push_back('\n');

    // written whole to <path>.partial, then renamed: a reader (or a full disk) never leaves a
    // part of the file at `path`, which keeps what it held
    const std::string partial = path + ".partial";
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw npy_error(path, "cannot open file for writing");
    out.write(kMagic, 6);
    const char version[2] = {1, 0};
    out.write(version, 2);
    const char length[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
    out.write(length, 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(packed.storage()->data()) + packed.offset() * dtype_size(packed.dtype()),
              static_cast<std::streamsize>(packed.numel() * dtype_size(packed.dtype())));
    out.close();  // flushes: a full disk shows here
    if (!out) {
        std::remove(partial.c_str());
        throw npy_error(path, "write failed (disk full?)");
    }
    std::filesystem::rename(partial, path);
}

Tensor load_saved_state(const std::string& path) {
    const Tensor tensor = load_npy_floats(path, "a corrupt state: ");
    for (const double value : tensor.to_vector()) {
        if (!std::isfinite(value)) throw npy_error(path, "a corrupt state: it holds " + std::to_string(value));
    }
    return tensor;
}

}  // namespace relgrad
