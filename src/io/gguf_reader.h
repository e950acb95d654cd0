// GGUFReader: parses a GGUF v3 file (format in io/gguf.h) through a read-only memory map.
// Every length and offset is checked against the file size; a truncated or malformed file, or a
// tensor type we do not implement, raises DEP_MODEL_LOAD_FAILED naming the file and byte offset.
// Used to verify exports (round trips in tests, read-back after writing) and to inspect GGUF files.
#pragma once

#include <cstdint>
#include <memory>
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
  const GGUFValue* find(const std::string& key) const;  // nullptr when absent
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;
  // The tensor's values as f32 (dequantized).
  std::vector<float> dequantize(const GGUFTensorInfo& t) const;

 private:
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
