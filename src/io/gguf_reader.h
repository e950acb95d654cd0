// GGUFReader: parses a GGUF v3 file (format in io/gguf.h) through a read-only memory map.
// Every length and offset is checked against the file size; a truncated or malformed file, or a
// tensor type we do not implement, raises DEP_MODEL_LOAD_FAILED naming the file and byte offset.
// Metadata is read through the typed getters (get_int, get_string, ...), which check the stored
// type: a value of the wrong type is the file's fault (DEP_MODEL_LOAD_FAILED), never a JSON
// conversion error further on.
// Used to verify exports (round trips in tests, read-back after writing) and to inspect GGUF files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/quantize.h"

namespace bp {

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // row-major, outermost first (the reverse of ne)
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;  // relative to the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
  int64_t numel() const;
};

class GGUFReader {
 public:
  explicit GGUFReader(const std::string& path);
  // Parses a GGUF image in memory (not copied: `data` must outlive the reader); `name` is for
  // messages. Used by the fuzz target.
  GGUFReader(const uint8_t* data, uint64_t size, std::string name);
  ~GGUFReader();
  GGUFReader(const GGUFReader&) = delete;
  GGUFReader& operator=(const GGUFReader&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  uint64_t file_bytes() const { return size_; }
  const GGUFMetadata& metadata() const { return kv_; }
  const GGUFValue* find(const std::string& key) const;  // nullptr when absent (the value unchecked)

  // Typed metadata reads: std::nullopt when the key is absent; a value of another GGUF type ->
  // DEP_MODEL_LOAD_FAILED naming the file, the key, the type expected and the type stored.
  // Integers: any integer type whose value fits int64. Numbers: any integer or float type, finite.
  // Strings must be valid UTF-8 (for arrays the message names the index of the first bad one).
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_number(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<std::vector<int64_t>> get_ints(const std::string& key) const;
  std::optional<std::vector<double>> get_numbers(const std::string& key) const;
  std::optional<std::vector<std::string>> get_strings(const std::string& key) const;
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;
  // The tensor's values as f32 (dequantized).
  std::vector<float> dequantize(const GGUFTensorInfo& t) const;

 private:
  enum class Kind { Integer, Number, Bool, String };
  // The value of `key` (nullptr when absent) after checking it is a `kind` scalar, or an array of them.
  const GGUFValue* typed(const std::string& key, Kind kind, bool want_array) const;
  // One value (of `key`, element `index` of an array, or -1 for a scalar), range- and UTF-8-checked.
  const nlohmann::json& element(const nlohmann::json& v, Kind kind, const std::string& key, int64_t index) const;
  template <class T>
  std::optional<T> scalar(const std::string& key, Kind kind) const;
  template <class T>
  std::optional<std::vector<T>> array(const std::string& key, Kind kind) const;
  [[noreturn]] void bad_value(const std::string& what, const std::string& why) const;
  void parse(const uint8_t* base);  // fills everything from size_ bytes at base
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGGUFDefaultAlignment;
  uint64_t data_offset_ = 0;
  GGUFMetadata kv_;
  std::vector<GGUFTensorInfo> tensors_;
};

}  // namespace bp
