// safetensors: read (mmap, single file or sharded) and write (atomic, optionally sharded).
//
// File layout (https://github.com/huggingface/safetensors):
//   [8 bytes little-endian N][N bytes JSON header][data section]
//   header = {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ...}, offsets relative to the data section.
// A sharded model is model-00001-of-0000K.safetensors ... plus model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {"<name>": "<shard file>"}}).
//
// Reading: the header is validated completely when a file is opened (size, JSON, dtypes, shapes,
// offsets inside the file, no overlaps), so a truncated or damaged file fails at open with
// DEP_MODEL_LOAD_FAILED naming the file and the first bad tensor, never a crash. Tensors of
// dtypes this project does not compute with (I64, U8, ...) are listed but only fail when read.
// Writing: temp file, fsync, rename, fsync of the folder; ENOSPC -> STATE_DISK_FULL, other I/O
// errors -> RUNTIME_EXPORT_FAILED. Metadata defaults to {"format": "pt"} as transformers expects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/atomic_file.h"  // write_file_atomic

namespace bp {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_str;        // as in the file: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;   // set for F32, BF16, F16, I32 (the dtypes Tensor holds)
  std::vector<int64_t> shape;   // any rank in the file; Tensors need rank <= 4
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in file (offset) order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
};

// Parses and validates the header of a safetensors file whose first `size` bytes are `data`
// (the whole file: offsets are checked against it). `source` names the file in errors.
// Throws DEP_MODEL_LOAD_FAILED; never reads outside [data, data + size).
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& source);

// One mmap'd safetensors file.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const uint8_t* bytes(const SafetensorsEntry& e) const { return base_ + header_.data_offset + e.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
};

// The tensors of a model folder (model.safetensors or a sharded index) or of one file.
class SafetensorsReader {
 public:
  // `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
  static SafetensorsReader open_model(const std::string& dir);
  // One file, or an index .json naming shards next to it.
  static SafetensorsReader open_file(const std::string& path);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  std::vector<std::string> names() const;                        // sorted
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the files
  const std::string& file_of(const std::string& name) const;
  std::map<std::string, std::string> metadata() const;  // of the first file

  // A zero-copy view of the mmap'd bytes in the file's dtype (keeps the mapping alive).
  Tensor borrow(const std::string& name) const;
  // Drops the file pages of a tensor that has been copied out from this process's resident memory
  // (madvise DONTNEED on the whole pages inside it; a later read maps them in again). Loading a
  // model held quantized calls it per tensor, so the mapped file never adds up in the peak RSS.
  void release(const std::string& name) const;
  // A copy converted to `dtype` (f32 by default) from the CPU allocator. When `expected` is
  // given, a different shape throws DEP_MODEL_LOAD_FAILED naming file, tensor and both shapes.
  Tensor read(const std::string& name, const std::optional<Shape>& expected = std::nullopt,
              DType dtype = DType::F32) const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  std::string source_;                   // what was opened, for messages
};

struct SafetensorsWriteOptions {
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::optional<DType> dtype;  // convert every float tensor to this dtype while writing
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one file atomically. Tensors are written in the given order; names must be unique.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const SafetensorsWriteOptions& options = {});

// The same file written from a stream: the tensors' names, dtypes and shapes first (the header),
// then `produce(write)` hands their bytes in that order, in pieces of any size, exactly their total
// (else RUNTIME_INTERNAL). For data gathered piece by piece (a ZeRO-1 optimizer state from every
// rank) that is never held whole.
struct SafetensorsSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};
void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                                const std::function<void(const std::function<void(const void*, size_t)>&)>& produce,
                                const SafetensorsWriteOptions& options = {});

// Writes a model's weights into `dir`: one model.safetensors when the data fits in
// `max_shard_bytes` (0 = no limit), else model-0000i-of-0000K.safetensors + the index.
// Stale files of the other layout are removed. Returns the file names written (index last).
std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 size_t max_shard_bytes = 0,
                                                 const SafetensorsWriteOptions& options = {});

// write_file_atomic (the JSON files next to weights) is io/atomic_file.h's, included above.

}  // namespace bp
