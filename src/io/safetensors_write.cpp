// safetensors writing: through io/atomic_file (temp name, fsync, rename, fsync of the folder; and
// its fault injection) and sharded model folders with model.safetensors.index.json (see safetensors.h).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace bp {

namespace {

[[noreturn]] void io_fail(const std::string& path, const char* what, int err) {
  const ErrorCode code =
      (err == ENOSPC || err == EDQUOT) ? ErrorCode::STATE_DISK_FULL : ErrorCode::RUNTIME_EXPORT_FAILED;
  Error e(code, fmt::format("[safetensors] {}: {} failed: {}", path, what, std::strerror(err)));
  if (code == ErrorCode::STATE_DISK_FULL) e.with_suggestion(kDiskFullFileSuggestion);
  throw e;
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    default: break;  // block types are never written to safetensors (callers dequantize first)
  }
  return "?";
}

bool is_float(DType t) {
  return t != DType::I32;
}

DType output_dtype(const Tensor& t, const SafetensorsWriteOptions& o) {
  return (o.dtype && is_float(t.dtype())) ? *o.dtype : t.dtype();
}

bool is_shard_name(const std::string& n) {
  return n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos && n.size() > 12 &&
         n.substr(n.size() - 12) == ".safetensors";
}

}  // namespace

// The header (its 8-byte length first, padded so the data starts 8-byte aligned) of tensors with
// these names, dtypes and shapes, in order.
static std::string safetensors_header(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                                      const SafetensorsWriteOptions& options, uint64_t* data_bytes) {
  nlohmann::json header = nlohmann::json::object();
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const SafetensorsSpec& s : specs) {
    BP_CHECK(seen.insert(s.name).second, "[safetensors] {}: tensor '{}' given twice", path, s.name);
    BP_CHECK(s.name != "__metadata__", "[safetensors] {}: reserved tensor name '__metadata__'", path);
    const uint64_t nbytes = static_cast<uint64_t>(s.shape.numel()) * dtype_size(s.dtype);
    header[s.name] = {
        {"dtype", safetensors_dtype(s.dtype)}, {"shape", s.shape.vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // data section starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
  *data_bytes = offset;
  return out + h;
}

void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                                const std::function<void(const std::function<void(const void*, size_t)>&)>& produce,
                                const SafetensorsWriteOptions& options) {
  uint64_t total = 0;
  const std::string head = safetensors_header(path, specs, options, &total);
  AtomicFile f(path);
  f.write(head);
  uint64_t written = 0;
  produce([&](const void* data, size_t bytes) {
    f.write(data, bytes);
    written += bytes;
  });
  BP_CHECK(written == total, "[safetensors] {}: {} bytes of tensor data written, the header says {}", path, written,
           total);
  f.commit();
}

void write_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsWriteOptions& options) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) {
    BP_CHECK(t.defined() && t.device().type == DeviceType::CPU, "[safetensors] {}: tensor '{}' is {}", path, name,
             t.defined() ? t.describe() : "undefined");
    specs.push_back({name, output_dtype(t, options), t.shape()});
  }
  uint64_t total = 0;
  const std::string head = safetensors_header(path, specs, options, &total);
  AtomicFile f(path);
  f.write(head);
  std::vector<uint8_t> buf;
  for (const auto& [name, t] : tensors) {
    const DType dt = output_dtype(t, options);
    const size_t n = static_cast<size_t>(t.numel());
    if (dt == t.dtype()) {
      f.write(t.raw(), t.nbytes());
      continue;
    }
    constexpr size_t kChunk = 1 << 18;  // elements converted at a time
    buf.resize(kChunk * dtype_size(dt));
    const uint8_t* src = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < n; i += kChunk) {
      const size_t m = std::min(kChunk, n - i);
      convert(src + i * dtype_size(t.dtype()), t.dtype(), buf.data(), dt, m);
      f.write(buf.data(), m * dtype_size(dt));
    }
  }
  f.commit();
}

std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 size_t max_shard_bytes, const SafetensorsWriteOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) io_fail(dir, "create folder", ec.value());

  // Greedy split in the given order: a new shard starts when the next tensor would not fit.
  std::vector<NamedTensors> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& nt : tensors) {
    const uint64_t b = static_cast<uint64_t>(nt.second.numel()) * dtype_size(output_dtype(nt.second, options));
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + b > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(nt);
    shard_bytes += b;
    total_bytes += b;
  }

  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, options);
    written.push_back("model.safetensors");
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      write_safetensors((fs::path(dir) / name).string(), shards[i], options);
      for (const auto& nt : shards[i]) weight_map[nt.first] = name;
      written.push_back(name);
    }
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    written.push_back("model.safetensors.index.json");
  }
  // Remove files of a previous, different layout so loading is never ambiguous.
  const std::set<std::string> keep(written.begin(), written.end());
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string n = de.path().filename().string();
    if (keep.count(n)) continue;
    if (n == "model.safetensors" || n == "model.safetensors.index.json" || is_shard_name(n)) fs::remove(de.path(), ec);
  }
  return written;
}

}  // namespace bp
