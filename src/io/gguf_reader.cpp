// GGUF v3 reader (contract in io/gguf_reader.h).
#include "io/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/file_read.h"

namespace bp {
namespace {

// Bounds-checked little-endian cursor over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path) : base_(base), size_(size), path_(path) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[gguf] {} is not a valid GGUF file: {} at byte {} of {}", path_, what, pos_, size_));
  }
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) fail(fmt::format("{} needs {} bytes but the file ends", what, n));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }
  uint64_t pos() const { return pos_; }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

nlohmann::json read_scalar(Cursor& c, GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: return c.get<uint8_t>("uint8");
    case GGUFValueType::INT8: return c.get<int8_t>("int8");
    case GGUFValueType::UINT16: return c.get<uint16_t>("uint16");
    case GGUFValueType::INT16: return c.get<int16_t>("int16");
    case GGUFValueType::UINT32: return c.get<uint32_t>("uint32");
    case GGUFValueType::INT32: return c.get<int32_t>("int32");
    case GGUFValueType::FLOAT32: return static_cast<double>(c.get<float>("float32"));
    case GGUFValueType::BOOL: {
      const uint8_t b = c.get<uint8_t>("bool");
      if (b > 1) c.fail(fmt::format("bool value {}", b));
      return b == 1;
    }
    case GGUFValueType::STRING: return c.str("string");
    case GGUFValueType::UINT64: return c.get<uint64_t>("uint64");
    case GGUFValueType::INT64: return c.get<int64_t>("int64");
    case GGUFValueType::FLOAT64: return c.get<double>("float64");
    case GGUFValueType::ARRAY: break;
  }
  c.fail(fmt::format("value type {}", static_cast<uint32_t>(t)));
}

bool is_integer(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8:
    case GGUFValueType::INT8:
    case GGUFValueType::UINT16:
    case GGUFValueType::INT16:
    case GGUFValueType::UINT32:
    case GGUFValueType::INT32:
    case GGUFValueType::UINT64:
    case GGUFValueType::INT64: return true;
    default: return false;
  }
}

// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80)
      n = 1, cp = c;
    else if ((c & 0xE0) == 0xC0)
      n = 2, cp = c & 0x1Fu, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      n = 3, cp = c & 0x0Fu, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      n = 4, cp = c & 0x07u, min = 0x10000;
    else
      return false;
    if (n > s.size() - i) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

GGUFValueType value_type(Cursor& c, uint32_t raw) {
  if (raw > static_cast<uint32_t>(GGUFValueType::FLOAT64)) c.fail(fmt::format("unknown value type {}", raw));
  return static_cast<GGUFValueType>(raw);
}

}  // namespace

int64_t GGUFTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GGUFReader::GGUFReader(const std::string& path) : path_(path) {
  {
    const OpenFile file = open_regular_file(path, {"gguf", ErrorCode::DEP_MODEL_LOAD_FAILED});
    size_ = file.size();
    if (size_ > 0) {
      map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (map_ == MAP_FAILED) {
        map_ = nullptr;
        throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                    fmt::format("[gguf] cannot map {}: {}", path, std::strerror(errno)));
      }
    }
  }
  try {
    parse(static_cast<const uint8_t*>(map_));
  } catch (...) {
    if (map_) ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

GGUFReader::GGUFReader(const uint8_t* data, uint64_t size, std::string name) : path_(std::move(name)), size_(size) {
  parse(data);
}

void GGUFReader::parse(const uint8_t* base) {
  {
    Cursor c(base, size_, path_);
    if (c.get<uint32_t>("magic") != kGGUFMagic) c.fail("bad magic (expected \"GGUF\")");
    version_ = c.get<uint32_t>("version");
    if (version_ != 3 && version_ != 2) c.fail(fmt::format("unsupported version {}", version_));
    const uint64_t n_tensors = c.get<uint64_t>("tensor count");
    const uint64_t n_kv = c.get<uint64_t>("metadata count");
    // Each entry takes at least 8 bytes: reject absurd counts before reserving.
    if (n_kv > size_ / 8 || n_tensors > size_ / 8)
      c.fail(fmt::format("{} keys / {} tensors in a file this small", n_kv, n_tensors));
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = c.str("key");
      GGUFValue v;
      v.type = value_type(c, c.get<uint32_t>("value type"));
      if (v.type == GGUFValueType::ARRAY) {
        v.elem_type = value_type(c, c.get<uint32_t>("array type"));
        if (v.elem_type == GGUFValueType::ARRAY) c.fail("nested array in '" + key + "'");
        const uint64_t n = c.get<uint64_t>("array length");
        if (n > size_) c.fail(fmt::format("array '{}' of {} elements", key, n));
        v.value = nlohmann::json::array();
        for (uint64_t k = 0; k < n; ++k) v.value.push_back(read_scalar(c, v.elem_type));
      } else {
        v.value = read_scalar(c, v.type);
      }
      if (key == "general.alignment") {
        if (v.type != GGUFValueType::UINT32 || v.value.get<uint32_t>() == 0 || v.value.get<uint32_t>() % 8 != 0)
          c.fail("general.alignment must be a uint32 multiple of 8");
        alignment_ = v.value.get<uint32_t>();
      }
      kv_.emplace_back(std::move(key), std::move(v));
    }
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GGUFTensorInfo t;
      t.name = c.str("tensor name");
      const uint32_t n_dims = c.get<uint32_t>("n_dims");
      if (n_dims == 0 || n_dims > 4) c.fail(fmt::format("tensor '{}' has {} dimensions", t.name, n_dims));
      std::vector<int64_t> ne(n_dims);
      for (auto& d : ne) {
        const uint64_t v = c.get<uint64_t>("dimension");
        if (v > (uint64_t{1} << 40)) c.fail(fmt::format("tensor '{}' dimension {}", t.name, v));
        d = static_cast<int64_t>(v);
      }
      t.shape.assign(ne.rbegin(), ne.rend());
      const uint32_t type = c.get<uint32_t>("tensor type");
      if (!ggml_type_known(type))
        c.fail(fmt::format("tensor '{}' has ggml type {} which backprop does not read", t.name, type));
      t.type = static_cast<GGMLType>(type);
      t.offset = c.get<uint64_t>("tensor offset");
      if (t.offset % alignment_ != 0)
        c.fail(fmt::format("tensor '{}' offset {} is not aligned to {}", t.name, t.offset, alignment_));
      const auto& info = ggml_type_info(t.type);
      if (ne[0] % info.block_size != 0)
        c.fail(fmt::format("tensor '{}' rows of {} do not fit {} blocks", t.name, ne[0], info.name));
      // Checked: four dimensions of up to 2^40 overflow 64 bits; the data must fit in the file anyway.
      uint64_t numel = 1, nbytes = 0;
      for (int64_t d : ne)
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) || numel > size_ * 8)
          c.fail(fmt::format("tensor '{}' has more elements than a file of {} bytes can hold", t.name, size_));
      if (__builtin_mul_overflow(numel / info.block_size, static_cast<uint64_t>(info.block_bytes), &nbytes))
        c.fail(fmt::format("tensor '{}' byte size overflows", t.name));
      t.nbytes = static_cast<size_t>(nbytes);
      tensors_.push_back(std::move(t));
    }
    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    for (auto& t : tensors_) {
      if (t.offset > size_ || data_offset_ > size_ - t.offset || t.nbytes > size_ - data_offset_ - t.offset)
        c.fail(fmt::format("tensor '{}' ({} bytes at data offset {}) runs past the end of the file", t.name, t.nbytes,
                           t.offset));
      t.data = base + data_offset_ + t.offset;
    }
  }
}

GGUFReader::~GGUFReader() {
  if (map_) ::munmap(map_, size_);
}

const GGUFValue* GGUFReader::find(const std::string& key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

void GGUFReader::bad_value(const std::string& what, const std::string& why) const {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[gguf] {}: metadata {} {}", path_, what, why))
      .with_suggestion(
          "The file's metadata does not follow llama.cpp's GGUF conventions; convert the model again with "
          "llama.cpp's convert_hf_to_gguf.py, or pass the Hugging Face folder instead.");
}

const GGUFValue* GGUFReader::typed(const std::string& key, Kind kind, bool want_array) const {
  const GGUFValue* v = find(key);
  if (!v) return nullptr;
  auto fits = [&](GGUFValueType t) {
    switch (kind) {
      case Kind::Integer: return is_integer(t);
      case Kind::Number: return is_integer(t) || t == GGUFValueType::FLOAT32 || t == GGUFValueType::FLOAT64;
      case Kind::Bool: return t == GGUFValueType::BOOL;
      case Kind::String: return t == GGUFValueType::STRING;
    }
    return false;
  };
  if (want_array ? v->type == GGUFValueType::ARRAY && fits(v->elem_type) : fits(v->type)) return v;
  static constexpr const char* kScalar[] = {"an integer", "a number", "a bool", "a string"};
  static constexpr const char* kArray[] = {"an array of integers", "an array of numbers", "an array of bools",
                                           "an array of strings"};
  const char* expected = (want_array ? kArray : kScalar)[static_cast<int>(kind)];
  const std::string stored = v->type == GGUFValueType::ARRAY
                                 ? fmt::format("array of {}", gguf_value_type_name(v->elem_type))
                                 : std::string(gguf_value_type_name(v->type));
  bad_value("'" + key + "'", fmt::format("must be {}, but its GGUF type is {}", expected, stored));
}

const nlohmann::json& GGUFReader::element(const nlohmann::json& v, Kind kind, const std::string& key,
                                          int64_t index) const {
  auto what = [&] { return index < 0 ? fmt::format("'{}'", key) : fmt::format("'{}' element {}", key, index); };
  if (kind == Kind::Integer && v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})
    bad_value(what(), fmt::format("is {}, past the largest 64-bit signed integer", v.get<uint64_t>()));
  if (kind == Kind::Number && !std::isfinite(v.get<double>()))
    bad_value(what(), fmt::format("is {}; it must be a finite number", v.get<double>()));
  if (kind == Kind::String && !valid_utf8(v.get_ref<const std::string&>()))
    bad_value(what(), "is not valid UTF-8 text");
  return v;
}

template <class T>
std::optional<T> GGUFReader::scalar(const std::string& key, Kind kind) const {
  const GGUFValue* v = typed(key, kind, false);
  if (!v) return std::nullopt;
  return element(v->value, kind, key, -1).get<T>();
}

template <class T>
std::optional<std::vector<T>> GGUFReader::array(const std::string& key, Kind kind) const {
  const GGUFValue* v = typed(key, kind, true);
  if (!v) return std::nullopt;
  std::vector<T> out;
  out.reserve(v->value.size());
  for (size_t i = 0; i < v->value.size(); ++i)
    out.push_back(element(v->value[i], kind, key, static_cast<int64_t>(i)).get<T>());
  return out;
}

std::optional<int64_t> GGUFReader::get_int(const std::string& key) const {
  return scalar<int64_t>(key, Kind::Integer);
}
std::optional<double> GGUFReader::get_number(const std::string& key) const {
  return scalar<double>(key, Kind::Number);
}
std::optional<bool> GGUFReader::get_bool(const std::string& key) const {
  return scalar<bool>(key, Kind::Bool);
}
std::optional<std::string> GGUFReader::get_string(const std::string& key) const {
  return scalar<std::string>(key, Kind::String);
}
std::optional<std::vector<int64_t>> GGUFReader::get_ints(const std::string& key) const {
  return array<int64_t>(key, Kind::Integer);
}
std::optional<std::vector<double>> GGUFReader::get_numbers(const std::string& key) const {
  return array<double>(key, Kind::Number);
}
std::optional<std::vector<std::string>> GGUFReader::get_strings(const std::string& key) const {
  return array<std::string>(key, Kind::String);
}

const GGUFTensorInfo* GGUFReader::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> GGUFReader::dequantize(const GGUFTensorInfo& t) const {
  if (t.numel() == 0) return {};  // a zero-size tensor: no rows to convert (and no buffers to copy)
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const int64_t n = t.shape.back();
  dequantize_rows(t.type, t.data, out.data(), n > 0 ? t.numel() / n : 0, n);
  return out;
}

}  // namespace bp
