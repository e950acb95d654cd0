// GGUF v3 writer (format in io/gguf.h, contract in io/gguf_writer.h).
#include "io/gguf_writer.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"

namespace bp {
namespace {

std::atomic<int64_t> g_free_space{-1};

[[noreturn]] void throw_io(int err, const std::string& what, const std::string& path) {
  if (err == ENOSPC || err == EDQUOT)
    throw Error(ErrorCode::STATE_DISK_FULL,
                fmt::format("[gguf] no space left on the device while {} {}: {}", what, path, std::strerror(err)))
        .with_suggestion(kDiskFullFileSuggestion);
  throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED, fmt::format("[gguf] {} {}: {}", what, path, std::strerror(err)));
}

// Buffered writes in front of the crash-safe AtomicFile (io/atomic_file.h, which also streams the
// bytes to the disk and holds the one disk-full test hook): small pieces (header, padding) are
// gathered, tensor slices go straight through.
class BufferedOut {
 public:
  explicit BufferedOut(AtomicFile& file) : file_(file) { buf_.reserve(kBufBytes); }
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    if (buf_.size() + n > kBufBytes) flush();
    if (n >= kDirectBytes) {  // tensor slices: straight to the kernel, no copy through buf_
      flush();
      file_.write(c, n);
      return;
    }
    buf_.insert(buf_.end(), c, c + n);
  }
  void zeros(size_t n) {
    static const uint8_t z[64] = {};
    while (n > 0) {
      const size_t k = std::min(n, sizeof(z));
      put(z, k);
      n -= k;
    }
  }
  uint64_t position() const { return file_.bytes_written() + buf_.size(); }
  void flush() {
    if (!buf_.empty()) file_.write(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kBufBytes = 8u << 20;
  static constexpr size_t kDirectBytes = 1u << 20;
  AtomicFile& file_;
  std::vector<uint8_t> buf_;
};

// ---- metadata encoding -------------------------------------------------------------------------
template <class T>
void put_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the build targets little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put_le<uint64_t>(out, s.size());
  out.append(s);
}

void put_scalar(std::string& out, GGUFValueType t, const nlohmann::json& v, const std::string& key) {
  try {
    switch (t) {
      case GGUFValueType::UINT8: put_le<uint8_t>(out, v.get<uint8_t>()); return;
      case GGUFValueType::INT8: put_le<int8_t>(out, v.get<int8_t>()); return;
      case GGUFValueType::UINT16: put_le<uint16_t>(out, v.get<uint16_t>()); return;
      case GGUFValueType::INT16: put_le<int16_t>(out, v.get<int16_t>()); return;
      case GGUFValueType::UINT32: put_le<uint32_t>(out, v.get<uint32_t>()); return;
      case GGUFValueType::INT32: put_le<int32_t>(out, v.get<int32_t>()); return;
      case GGUFValueType::FLOAT32: put_le<float>(out, static_cast<float>(v.get<double>())); return;
      case GGUFValueType::BOOL: put_le<uint8_t>(out, v.get<bool>() ? 1 : 0); return;
      case GGUFValueType::STRING: put_string(out, v.get<std::string>()); return;
      case GGUFValueType::UINT64: put_le<uint64_t>(out, v.get<uint64_t>()); return;
      case GGUFValueType::INT64: put_le<int64_t>(out, v.get<int64_t>()); return;
      case GGUFValueType::FLOAT64: put_le<double>(out, v.get<double>()); return;
      case GGUFValueType::ARRAY: break;
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[gguf] metadata '{}' holds {} which is not a {}: {}", key,
                                                         v.dump().substr(0, 80), gguf_value_type_name(t), e.what()));
  }
  throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[gguf] metadata '{}': nested arrays are not supported", key));
}

void put_value(std::string& out, const std::string& key, const GGUFValue& v) {
  put_string(out, key);
  put_le<uint32_t>(out, static_cast<uint32_t>(v.type));
  if (v.type != GGUFValueType::ARRAY) {
    put_scalar(out, v.type, v.value, key);
    return;
  }
  BP_CHECK(v.value.is_array(), "[gguf] metadata '{}' is declared an array but holds {}", key, v.value.type_name());
  put_le<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  put_le<uint64_t>(out, v.value.size());
  for (const auto& e : v.value) put_scalar(out, v.elem_type, e, key);
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

const char* gguf_value_type_name(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: return "uint8";
    case GGUFValueType::INT8: return "int8";
    case GGUFValueType::UINT16: return "uint16";
    case GGUFValueType::INT16: return "int16";
    case GGUFValueType::UINT32: return "uint32";
    case GGUFValueType::INT32: return "int32";
    case GGUFValueType::FLOAT32: return "float32";
    case GGUFValueType::BOOL: return "bool";
    case GGUFValueType::STRING: return "string";
    case GGUFValueType::ARRAY: return "array";
    case GGUFValueType::UINT64: return "uint64";
    case GGUFValueType::INT64: return "int64";
    case GGUFValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

GGUFValue GGUFValue::f32s(const std::vector<float>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (float f : v) a.push_back(static_cast<double>(f));
  return array(GGUFValueType::FLOAT32, std::move(a));
}

int64_t GGUFTensorSpec::num_rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

GGUFTensorSpec gguf_tensor_from(const std::string& name, const Tensor& t, GGMLType type) {
  BP_CHECK(t.defined() && t.dtype() == DType::F32 && t.device().type == DeviceType::CPU,
           "[gguf] tensor '{}' must be f32 on the CPU, got {}", name, t.describe());
  GGUFTensorSpec s;
  s.name = name;
  s.shape = t.shape().vec();
  s.type = type;
  const int64_t n = s.row_length();
  ggml_row_bytes(type, n);  // throws when the row does not fit the block
  const size_t row_bytes = s.row_bytes();
  s.produce = [t, type, n, row_bytes](uint8_t* dst, int64_t r0, int64_t r1) {
    (void)row_bytes;
    quantize_rows(type, t.data<float>() + r0 * n, dst, r1 - r0, n);
  };
  return s;
}

GGUFWriter::GGUFWriter(uint32_t alignment) : alignment_(alignment) {
  BP_CHECK(alignment > 0 && alignment % 8 == 0, "[gguf] alignment {} must be a positive multiple of 8", alignment);
  set("general.alignment", GGUFValue::u32(alignment));
}

void GGUFWriter::set(const std::string& key, GGUFValue value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(key, std::move(value));
}

void GGUFWriter::add_tensor(GGUFTensorSpec spec) {
  for (const auto& t : tensors_)
    if (t.name == spec.name)
      throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED, fmt::format("[gguf] tensor '{}' added twice", spec.name));
  if (spec.shape.empty() || spec.shape.size() > 4)
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED,
                fmt::format("[gguf] tensor '{}' has {} dimensions; GGUF stores 1 to 4", spec.name, spec.shape.size()));
  ggml_row_bytes(spec.type, spec.row_length());
  BP_CHECK(static_cast<bool>(spec.produce), "[gguf] tensor '{}' has no data producer", spec.name);
  tensors_.push_back(std::move(spec));
}

namespace {
// Header (magic .. tensor infos), unpadded; offsets of each tensor relative to the data section.
std::string encode_header(const GGUFMetadata& kv, const std::vector<GGUFTensorSpec>& tensors, uint32_t alignment,
                          std::vector<uint64_t>* offsets) {
  std::string h;
  put_le<uint32_t>(h, kGGUFMagic);
  put_le<uint32_t>(h, kGGUFVersion);
  put_le<uint64_t>(h, tensors.size());
  put_le<uint64_t>(h, kv.size());
  for (const auto& [k, v] : kv) put_value(h, k, v);
  uint64_t off = 0;
  offsets->clear();
  for (const auto& t : tensors) {
    put_string(h, t.name);
    put_le<uint32_t>(h, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put_le<uint64_t>(h, static_cast<uint64_t>(*it));
    put_le<uint32_t>(h, static_cast<uint32_t>(t.type));
    put_le<uint64_t>(h, off);
    offsets->push_back(off);
    off = align_up(off + t.nbytes(), alignment);
  }
  return h;
}
}  // namespace

uint64_t GGUFWriter::expected_file_bytes() const {
  std::vector<uint64_t> offsets;
  const std::string h = encode_header(kv_, tensors_, alignment_, &offsets);
  uint64_t total = align_up(h.size(), alignment_);
  if (!tensors_.empty()) total += offsets.back() + tensors_.back().nbytes();
  return total;
}

void GGUFWriter::write(const std::string& path) const {
  namespace fs = std::filesystem;
  std::vector<uint64_t> offsets;
  const std::string header = encode_header(kv_, tensors_, alignment_, &offsets);
  const uint64_t data_start = align_up(header.size(), alignment_);
  const uint64_t total = data_start + (tensors_.empty() ? 0 : offsets.back() + tensors_.back().nbytes());

  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED,
                fmt::format("[gguf] output folder {} does not exist", dir.string()));
  uint64_t free_bytes = 0;
  if (g_free_space.load() >= 0) {
    free_bytes = static_cast<uint64_t>(g_free_space.load());
  } else {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) throw_io(errno, "checking free space of", dir.string());
    free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }
  if (free_bytes < total)
    throw Error(ErrorCode::STATE_DISK_FULL,
                fmt::format("[gguf] {} needs {} but only {} are free on its file system", path, format_bytes(total),
                            format_bytes(free_bytes)),
                {{"bytes_needed", total}, {"bytes_free", free_bytes}})
        .with_suggestion(kDiskFullFileSuggestion);

  try {
    AtomicFile file(path);  // <path>.tmp, removed unless committed: an old export stays intact
    file.stream_to_disk();
    BufferedOut out(file);
    out.put(header.data(), header.size());
    out.zeros(data_start - header.size());
    // Two slice buffers: slice k+1 is converted (quantized, permuted) while slice k is written by
    // a second thread, so an f16/q8 export runs at max(convert, disk) rather than their sum.
    // Slices of about 4 MiB (small enough to overlap, large enough for big writes) bound the extra memory a tensor
    // needs.
    std::vector<uint8_t> bufs[2];
    std::future<void> pending;  // declared after `out` and `bufs`: destroyed (waited for) first
    int cur = 0;
    uint64_t pos = data_start;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      BP_CHECK(pos == data_start + offsets[i], "[gguf] tensor '{}' lands at {} instead of {}", t.name, pos,
               data_start + offsets[i]);
      const size_t row_bytes = t.row_bytes();
      const int64_t rows = t.num_rows();
      const int64_t rows_per_slice =
          std::max<int64_t>(1, static_cast<int64_t>((4u << 20) / std::max<size_t>(1, row_bytes)));
      for (int64_t r = 0; r < rows; r += rows_per_slice) {
        const int64_t r1 = std::min(rows, r + rows_per_slice);
        std::vector<uint8_t>& buf = bufs[cur];
        buf.resize(static_cast<size_t>(r1 - r) * row_bytes);
        t.produce(buf.data(), r, r1);
        pos += buf.size();
        size_t pad = 0;
        if (r1 == rows && i + 1 < tensors_.size()) {
          pad = data_start + offsets[i + 1] - pos;
          pos += pad;
        }
        if (pending.valid()) pending.get();  // rethrows the previous write's error
        pending = std::async(std::launch::async, [&out, &buf, pad] {
          out.put(buf.data(), buf.size());
          out.zeros(pad);
        });
        cur ^= 1;
      }
      if (rows == 0 && i + 1 < tensors_.size()) {
        if (pending.valid()) pending.get();
        out.zeros(data_start + offsets[i + 1] - pos);
        pos = data_start + offsets[i + 1];
      }
    }
    if (pending.valid()) pending.get();
    out.flush();
    BP_CHECK(out.position() == total, "[gguf] wrote {} bytes, expected {}", out.position(), total);
    file.commit();  // fsync, rename, fsync of the folder
  } catch (const Error& e) {
    if (e.code() != ErrorCode::RUNTIME_EXPORT_FAILED) throw;  // disk full keeps its own code
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED, fmt::format("[gguf] {}", e.what()), e.details());
  }
}

void gguf_set_write_fault_for_testing(int64_t fail_after_bytes, int err) {
  io_faults().enospc_after_bytes = fail_after_bytes;  // the one write-failure hook (io/atomic_file.h)
  io_faults().fail_errno = fail_after_bytes >= 0 ? err : ENOSPC;
}
void gguf_set_free_space_for_testing(int64_t bytes) {
  g_free_space = bytes;
}

}  // namespace bp
