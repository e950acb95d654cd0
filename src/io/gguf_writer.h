// GGUFWriter: builds a GGUF v3 file from metadata and a list of tensors (format in io/gguf.h).
//
// Tensors are produced lazily, a slice of rows at a time, while the file is written, so a model is
// never held twice in memory (quantized copies included). The write is all-or-nothing:
//   1. the exact file size is known up front; free space (statvfs) below it -> STATE_DISK_FULL
//      before anything is written;
//   2. bytes go through io/atomic_file's AtomicFile ("<path>.tmp", streamed to the disk as they come),
//      fsynced and renamed over <path> at the end;
//   3. on any failure the temporary file is removed and <path> (new or pre-existing) is untouched.
// ENOSPC/EDQUOT while writing -> STATE_DISK_FULL; other I/O errors -> RUNTIME_GGUF_EXPORT_FAILED.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/gguf.h"
#include "io/quantize.h"

namespace bp {

struct GGUFTensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // row-major, outermost first (HF layout: [out, in]); ne is the reverse
  GGMLType type = GGMLType::F32;
  // Writes rows [row_begin, row_end) in `type` to dst (row_bytes() each). Rows = all dims but the last.
  std::function<void(uint8_t* dst, int64_t row_begin, int64_t row_end)> produce;

  int64_t row_length() const { return shape.empty() ? 1 : shape.back(); }
  int64_t num_rows() const;
  size_t row_bytes() const { return ggml_row_bytes(type, row_length()); }
  size_t nbytes() const { return row_bytes() * static_cast<size_t>(num_rows()); }
};

// A spec that stores an f32 tensor (any rank, contiguous, on the CPU) as `type`; the tensor is
// shared, not copied. Throws RUNTIME_GGUF_EXPORT_FAILED when its last dimension does not fit the block.
GGUFTensorSpec gguf_tensor_from(const std::string& name, const Tensor& t, GGMLType type);

class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t alignment = kGGUFDefaultAlignment);

  // Sets a metadata key (replacing an earlier value; order of first insertion is kept).
  void set(const std::string& key, GGUFValue value);
  const GGUFMetadata& metadata() const { return kv_; }
  // Names must be unique (RUNTIME_GGUF_EXPORT_FAILED otherwise).
  void add_tensor(GGUFTensorSpec spec);
  const std::vector<GGUFTensorSpec>& tensors() const { return tensors_; }
  uint32_t alignment() const { return alignment_; }

  // Exact size of the file write() produces.
  uint64_t expected_file_bytes() const;
  void write(const std::string& path) const;

 private:
  uint32_t alignment_;
  GGUFMetadata kv_;
  std::vector<GGUFTensorSpec> tensors_;
};

// Test hooks (process-wide). Write fault: after `fail_after_bytes` more bytes have been written,
// the next write fails with errno `err` (ENOSPC, EIO, ...); -1 disables. It sets io_faults()
// (io/atomic_file.h), the one write-failure hook of every crash-safe writer. Free space
// override: pretend the destination file system has this many bytes free; -1 disables.
void gguf_set_write_fault_for_testing(int64_t fail_after_bytes, int err);
void gguf_set_free_space_for_testing(int64_t bytes);

}  // namespace bp
