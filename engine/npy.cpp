// The .npy layout: the magic "\x93NUMPY", a version (major, minor), the header length (2 bytes
// little-endian in version 1, 4 bytes in versions 2 and 3), the header -- a Python dict literal
// such as {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
// newline -- and then the raw elements.
#include "engine/npy.hpp"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/backend/backend.hpp"

namespace relgrad {

namespace {

const char kMagic[] = "\x93NUMPY";

std::runtime_error npy_error(const std::string& path, const std::string& what) {
    return std::runtime_error(path + ": " + what);
}

// The text after `'key':` in the header dict, leading spaces removed, or throws.
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
    const std::size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) throw npy_error(path, "corrupt .npy header: no '" + key + "' in " + header);
    const std::size_t colon = header.find_first_not_of(' ', at + key.size() + 2);
    if (colon == std::string::npos || header[colon] != ':') throw npy_error(path, "corrupt .npy header: " + header);
    const std::size_t value = header.find_first_not_of(' ', colon + 1);
    return value == std::string::npos ? "" : header.substr(value);
}

DType dtype_from_descr(const std::string& descr, const std::string& path) {
    if (descr == "<f4") return DType::float32;
    if (descr == "<f8") return DType::float64;
    if (descr == "<i8") return DType::int64;
    if (descr == "|b1") return DType::boolean;
    throw npy_error(path, "unsupported dtype '" + descr +
                              "' (supported: little-endian float32 '<f4', float64 '<f8', int64 '<i8', bool '|b1')");
}

const char* descr_of(DType dtype) {
    switch (dtype) {
        case DType::float32: return "<f4";
        case DType::float64: return "<f8";
        case DType::int64: return "<i8";
        case DType::boolean: return "|b1";
    }
    return "";
}

Shape parse_shape(std::string text, const std::string& path) {
    const std::size_t open = text.find('('), close = text.find(')');
    if (open == std::string::npos || close == std::string::npos || close < open) {
        throw npy_error(path, "corrupt .npy header: bad shape " + text);
    }
    std::stringstream items(text.substr(open + 1, close - open - 1));
    Shape shape;
    std::string item;
    while (std::getline(items, item, ',')) {
        if (item.find_first_not_of(' ') == std::string::npos) continue;  // "(3,)" ends with a comma
        std::size_t used = 0;
        long long size = -1;
        try {
            size = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || size < 0 ||
            item.find_first_not_of(' ', item.find_first_not_of(' ') + used) != std::string::npos) {
            throw npy_error(path, "corrupt .npy header: bad dimension '" + item + "' in shape " +
                                      text.substr(open, close - open + 1));
        }
        shape.push_back(size);
    }
    return shape;
}

}  // namespace

Tensor load_npy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw npy_error(path, "cannot open file");
    char magic[6];
    unsigned char version[2];
    if (!in.read(magic, 6) || std::memcmp(magic, kMagic, 6) != 0) throw npy_error(path, "not a .npy file (bad magic)");
    if (!in.read(reinterpret_cast<char*>(version), 2) || version[0] < 1 || version[0] > 3) {
        throw npy_error(path, "unsupported .npy format version");
    }
    unsigned char length_bytes[4] = {0, 0, 0, 0};
    const int length_size = version[0] == 1 ? 2 : 4;
    if (!in.read(reinterpret_cast<char*>(length_bytes), length_size)) throw npy_error(path, "truncated .npy header");
    const uint32_t header_length =
        length_bytes[0] | length_bytes[1] << 8 | length_bytes[2] << 16 | static_cast<uint32_t>(length_bytes[3]) << 24;
    if (header_length > (1u << 20))
        throw npy_error(path, "corrupt .npy header (length " + std::to_string(header_length) + ")");
    std::string header(header_length, '\0');
    if (!in.read(header.data(), header_length)) throw npy_error(path, "truncated .npy header");

    const std::string descr = header_value(header, "descr", path);
    const std::size_t close = descr.find('\'', 1);
    if (descr.empty() || descr[0] != '\'' || close == std::string::npos) {
        throw npy_error(path, "corrupt .npy header: 'descr' is not a quoted string in " + header);
    }
    const DType dtype = dtype_from_descr(descr.substr(1, close - 1), path);
    const std::string order = header_value(header, "fortran_order", path);
    if (order.rfind("True", 0) == 0) {
        throw npy_error(path, "Fortran-order arrays are not supported; save np.ascontiguousarray(a) instead");
    }
    if (order.rfind("False", 0) != 0)
        throw npy_error(path, "corrupt .npy header: 'fortran_order' is not True or False");
    const Shape shape = parse_shape(header_value(header, "shape", path), path);
    int64_t count = 0;
    try {
        count = shape_numel(shape);
    } catch (const std::invalid_argument& e) {
        throw npy_error(path, std::string("corrupt .npy header: ") + e.what());
    }

    // compare with the file's size before allocating anything
    const std::streamoff data_start = in.tellg();
    in.seekg(0, std::ios::end);
    const auto available = static_cast<uint64_t>(in.tellg() - data_start);
    in.seekg(data_start);
    const uint64_t nbytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    if (available < nbytes) {
        throw npy_error(path, "truncated data: shape " + shape_str(shape) + " " + dtype_name(dtype) + " needs " +
                                  std::to_string(nbytes) + " bytes, the file has " + std::to_string(available));
    }
    if (available > nbytes) {
        throw npy_error(path, "corrupt file: extra bytes after the " + std::to_string(nbytes) +
                                  " data bytes of shape " + shape_str(shape));
    }
    Tensor tensor;  // on the host; to(device) moves it
    try {
        tensor = empty(shape, dtype);
    } catch (const std::invalid_argument& e) {  // a shape whose strides would overflow
        throw npy_error(path, e.what());
    }
    char* host = static_cast<char*>(tensor.storage()->data());
    if (!in.read(host, static_cast<std::streamsize>(nbytes))) {
        throw npy_error(path, "read failed");
    }
    if (dtype == DType::boolean) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(host);
        for (std::size_t i = 0; i < nbytes; ++i) {
            if (bytes[i] > 1) throw npy_error(path, "corrupt bool data: byte " + std::to_string(bytes[i]));
        }
    }
    return tensor;
}

void save_npy(const Tensor& tensor, const std::string& path) {
    const Tensor packed = tensor.detach().to(Device::cpu).contiguous();  // a host copy of a device tensor
    std::string shape;                                                   // a Python tuple: (), (3,), (2, 3)
    for (int64_t s : packed.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
    shape = "(" + shape + (packed.dim() == 1 ? ",)" : ")");
    std::string header =
        std::string("{'descr': '") + descr_of(packed.dtype()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
    // pad so that magic + version + length + header is a multiple of 64 bytes, ending in '\n'
    const std::size_t preamble = 6 + 2 + 2;
    header.append(63 - (preamble + header.size()) % 64, ' ');
    header.push_back('\n');

    std::ofstream out(path, std::ios::binary | std::ios::trunc);
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
    if (!out) throw npy_error(path, "write failed");
}

}  // namespace relgrad
