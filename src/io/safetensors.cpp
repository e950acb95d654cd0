// safetensors reading: header validation, mmap'd files, sharded models (see safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"

namespace bp {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit the reference implementation uses

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[safetensors] {}: {}", source, what));
}

// Element size of every dtype name the format defines; 0 for an unknown name.
size_t element_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4},  {"U32", 4},     {"F16", 2},     {"BF16", 2},
      {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::optional<DType> tensor_dtype(const std::string& d) {
  if (d == "F32") return DType::F32;
  if (d == "BF16") return DType::BF16;
  if (d == "F16") return DType::F16;
  if (d == "I32") return DType::I32;
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// Converts n elements from a possibly unaligned source (mmap'd data sections need not be aligned).
void convert_from_unaligned(const uint8_t* src, DType st, void* dst, DType dt, size_t n) {
  const size_t es = dtype_size(st);
  if (reinterpret_cast<uintptr_t>(src) % es == 0) {
    convert(src, st, dst, dt, n);
    return;
  }
  alignas(64) uint8_t buf[16384];
  const size_t chunk = sizeof(buf) / es;
  for (size_t i = 0; i < n; i += chunk) {
    const size_t m = std::min(chunk, n - i);
    std::memcpy(buf, src + i * es, m * es);
    convert(buf, st, static_cast<uint8_t*>(dst) + i * dtype_size(dt), dt, m);
  }
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& v, uint64_t data_bytes,
                             const std::string& source) {
  auto bad = [&](const std::string& what) { fail(source, fmt::format("tensor '{}': {}", name, what)); };
  if (!v.is_object()) bad("header entry is not an object");
  SafetensorsEntry e;
  e.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
  e.dtype_str = dt->get<std::string>();
  const size_t es = element_size(e.dtype_str);
  if (es == 0) bad(fmt::format("unknown dtype '{}'", e.dtype_str));
  e.dtype = tensor_dtype(e.dtype_str);

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) bad("missing or non-list 'shape'");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) bad(fmt::format("bad dimension {} in shape", d.dump()));
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel)) bad("shape overflows");
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(es), &nbytes)) bad("shape overflows");

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_integer() ||
      !(*off)[1].is_number_integer() || (*off)[0].get<int64_t>() < 0 || (*off)[1].get<int64_t>() < 0)
    bad("'data_offsets' must be two non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin) bad(fmt::format("data_offsets [{}, {}] end before begin", e.begin, e.end));
  if (e.end > data_bytes)
    bad(fmt::format("data_offsets [{}, {}] go past the end of the data ({} bytes): the file is truncated or damaged",
                    e.begin, e.end, data_bytes));
  if (e.end - e.begin != nbytes)
    bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", shape_str(e.shape), e.dtype_str,
                    nbytes, e.begin, e.end, e.end - e.begin));
  return e;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8) fail(source, fmt::format("file is {} bytes, too small for a safetensors header", size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes) fail(source, fmt::format("header length {} is larger than the 100 MiB limit", n));
  if (n > size - 8)
    fail(source, fmt::format("header length {} goes past the end of the file ({} bytes): truncated or not a "
                             "safetensors file",
                             n, size));
  const char* begin = reinterpret_cast<const char*>(data + 8);
  if (json_nesting_depth(std::string_view(begin, n)) > kMaxJsonFileDepth)
    fail(source, fmt::format("header JSON is nested deeper than {} levels", kMaxJsonFileDepth));
  nlohmann::json j = nlohmann::json::parse(begin, begin + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail(source, "header is not a valid JSON object");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_bytes = size - h.data_offset;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) fail(source, "__metadata__ is not an object");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) fail(source, fmt::format("__metadata__ value of '{}' is not a string", mk));
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(key, v, data_bytes, source));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.entries.size(); ++i)
    if (h.entries[i].begin < h.entries[i - 1].end)
      fail(source, fmt::format("tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", h.entries[i].name,
                               h.entries[i].begin, h.entries[i].end, h.entries[i - 1].name, h.entries[i - 1].begin,
                               h.entries[i - 1].end));
  return h;
}

// ---- SafetensorsFile --------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const OpenFile file = open_regular_file(path, {"safetensors", ErrorCode::DEP_MODEL_LOAD_FAILED});
  f->size_ = static_cast<size_t>(file.size());
  if (f->size_ < 8) fail(path, fmt::format("file is {} bytes, too small for a safetensors header", f->size_));
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED) fail(path, fmt::format("mmap failed: {}", std::strerror(errno)));
  f->base_ = static_cast<const uint8_t*>(p);
  f->header_ = parse_safetensors_header(f->base_, f->size_, path);  // ~SafetensorsFile unmaps on throw
  for (size_t i = 0; i < f->header_.entries.size(); ++i) f->index_[f->header_.entries[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.entries[it->second];
}

// ---- SafetensorsReader ------------------------------------------------------------------------

SafetensorsReader SafetensorsReader::open_model(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) return open_file(index.string());
  if (fs::exists(single)) return open_file(single.string());
  fail(dir,
       "no model.safetensors or model.safetensors.index.json in this folder (only safetensors weights are "
       "supported, not .bin or .pth)");
}

SafetensorsReader SafetensorsReader::open_file(const std::string& path) {
  namespace fs = std::filesystem;
  SafetensorsReader r;
  r.source_ = path;
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json") {
    r.files_.push_back(SafetensorsFile::open(path));
    for (const SafetensorsEntry& e : r.files_[0]->header().entries) r.where_[e.name] = 0;
    return r;
  }
  // Sharded: the index maps every tensor to a shard file in the same folder.
  const nlohmann::json j =
      read_json_file_capped(path, FileKind::Config, {"safetensors", ErrorCode::DEP_MODEL_LOAD_FAILED});
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(path, "not a safetensors index (a JSON object with a \"weight_map\" object)");
  std::map<std::string, size_t> shard_index;
  for (const auto& [name, v] : j["weight_map"].items()) {
    if (!v.is_string()) fail(path, fmt::format("tensor '{}': shard name is not a string", name));
    const std::string shard = v.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
        shard == "." || shard == "..")
      fail(path, fmt::format("tensor '{}': shard '{}' is not a file name in the model folder", name, shard));
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const fs::path shard_path = fs::path(path).parent_path() / shard;
      if (!fs::exists(shard_path))
        fail(path, fmt::format("tensor '{}': shard file {} does not exist", name, shard_path.string()));
      r.files_.push_back(SafetensorsFile::open(shard_path.string()));
      it = shard_index.emplace(shard, r.files_.size() - 1).first;
    }
    if (!r.files_[it->second]->find(name))
      fail(r.files_[it->second]->path(),
           fmt::format("tensor '{}' is listed in {} for this shard but is missing from it", name, path));
    r.where_[name] = it->second;
  }
  return r;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> v;
  for (const auto& [n, i] : where_) v.push_back(n);
  return v;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(source_, fmt::format("tensor '{}' is missing", name));
  return *files_[it->second]->find(name);
}

const std::string& SafetensorsReader::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? source_ : files_[it->second]->path();
}

std::map<std::string, std::string> SafetensorsReader::metadata() const {
  return files_.empty() ? std::map<std::string, std::string>{} : files_[0]->header().metadata;
}

Tensor SafetensorsReader::borrow(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const SafetensorsFile& f = *files_[where_.at(name)];
  if (!e.dtype) fail(f.path(), fmt::format("tensor '{}': dtype {} is not supported", name, e.dtype_str));
  if (e.shape.size() > 4) fail(f.path(), fmt::format("tensor '{}': rank {} > 4", name, e.shape.size()));
  const uint8_t* p = f.bytes(e);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(*e.dtype) != 0) return read(name, std::nullopt, *e.dtype);
  return Tensor::borrow(const_cast<uint8_t*>(p), Shape(e.shape), *e.dtype, files_[where_.at(name)]);
}

void SafetensorsReader::release(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const SafetensorsFile& f = *files_[where_.at(name)];
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(f.bytes(e)), end = begin + (e.end - e.begin);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Tensor SafetensorsReader::read(const std::string& name, const std::optional<Shape>& expected, DType dtype) const {
  const SafetensorsEntry& e = entry(name);
  const SafetensorsFile& f = *files_[where_.at(name)];
  if (expected && (e.shape.size() != static_cast<size_t>(expected->rank) || e.shape != expected->vec()))
    fail(f.path(), fmt::format("tensor '{}' has shape {} but the model config needs {}", name, shape_str(e.shape),
                               expected->str()));
  if (e.shape.size() > 4) fail(f.path(), fmt::format("tensor '{}': rank {} > 4", name, e.shape.size()));
  if (!e.dtype || (*e.dtype == DType::I32) != (dtype == DType::I32))
    fail(f.path(), fmt::format("tensor '{}': cannot read dtype {} as {}", name, e.dtype_str, dtype_name(dtype)));
  Tensor t = Tensor::empty(Shape(e.shape), dtype);
  if (t.numel() > 0) convert_from_unaligned(f.bytes(e), *e.dtype, t.raw(), dtype, static_cast<size_t>(t.numel()));
  return t;
}

}  // namespace bp
