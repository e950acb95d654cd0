// The Collective's algorithms (rank-ordered sums), the in-process single rank, the MPI plugin's
// loader and the process-wide instance. See collective.h.
#include "core/collective.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/collective_plugin.h"
#include "core/error.h"
#include "core/system_readings.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end && *end == 0 && n >= 0 && n < (1L << 30) ? static_cast<int>(n) : fallback;
}

}  // namespace

LaunchInfo launch_from_environment() {
  LaunchInfo li;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    li.launcher = "mpirun";
    li.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    li.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  } else if (env("PMI_SIZE")) {
    li.launcher = "pmi";
    li.world = env_int("PMI_SIZE", 1);
    li.rank = env_int("PMI_RANK", 0);
  } else if (env("SLURM_STEP_ID") && env("SLURM_STEP_NUM_TASKS")) {  // a job step started by srun
    li.launcher = "srun";
    li.world = env_int("SLURM_STEP_NUM_TASKS", 1);
    li.rank = env_int("SLURM_PROCID", 0);
  }
  if (li.world < 1) li.world = 1;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (env(v)) {
      li.local_rank = env_int(v, -1);
      break;
    }
  return li;
}

// ---- what the collectives cost ------------------------------------------------------------------

namespace {
std::mutex& totals_mutex() {
  static std::mutex m;
  return m;
}
CommTotals& totals() {
  static CommTotals t;
  return t;
}
thread_local int t_depth = 0;  // CommScopes open on this thread
thread_local CommKind t_kind = CommKind::Other;
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

CommTotals comm_totals() {
  std::lock_guard<std::mutex> lock(totals_mutex());
  return totals();
}

CommScope::CommScope(CommKind kind) : outer_(t_depth++ == 0) {
  if (!outer_) return;
  t_kind = kind;
  start_ = now_s();
}

CommScope::~CommScope() {
  --t_depth;
  if (!outer_) return;
  const double dt = now_s() - start_;
  std::lock_guard<std::mutex> lock(totals_mutex());
  totals().seconds[static_cast<int>(t_kind)] += dt;
}

void CommScope::add_bytes(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(totals_mutex());
  totals().bytes[static_cast<int>(t_depth > 0 ? t_kind : CommKind::Other)] += bytes;
}

// ---- the algorithms -----------------------------------------------------------------------------

void Collective::all_reduce_sum(float* data, size_t n, size_t segment_floats) {
  reduce(data, n, segment_floats, true);
}

void Collective::reduce_scatter_sum(float* data, size_t n, size_t segment_floats) {
  reduce(data, n, segment_floats, false);
}

void Collective::all_reduce_sum(const std::vector<Tensor*>& tensors, size_t bucket_floats) {
  reduce(tensors, bucket_floats, true);
}

void Collective::reduce_scatter_sum(const std::vector<Tensor*>& tensors, size_t bucket_floats) {
  reduce(tensors, bucket_floats, false);
}

// The reduce-scatter of each segment (steps 1 and 2), then with `gather` its all-gather (step 3).
void Collective::reduce(float* data, size_t n, size_t segment_floats, bool gather) {
  const int w = world();
  if (w == 1 || n == 0) return;
  const CommScope scope;
  segment_floats = std::max<size_t>(segment_floats, 1);
  const size_t W = static_cast<size_t>(w), me = static_cast<size_t>(rank());
  std::vector<size_t> send_bytes(W), send_off(W), recv_bytes(W), recv_off(W), chunk_bytes(W), chunk_off(W);
  std::vector<float> gathered, sum;
  for (size_t seg = 0; seg < n; seg += segment_floats) {
    const size_t m = std::min(segment_floats, n - seg);
    float* x = data + seg;
    // Chunk q of the segment: [m*q/W, m*(q+1)/W) (sizes differ by at most one).
    for (size_t q = 0; q < W; ++q) {
      const size_t b = m * q / W, e = m * (q + 1) / W;
      chunk_off[q] = b * sizeof(float);
      chunk_bytes[q] = (e - b) * sizeof(float);
    }
    const size_t mine = chunk_bytes[me] / sizeof(float);
    // 1. reduce-scatter's exchange: my chunk q to rank q; rank q's copy of my chunk into slot q.
    for (size_t q = 0; q < W; ++q) {
      send_bytes[q] = chunk_bytes[q];
      send_off[q] = chunk_off[q];
      recv_bytes[q] = chunk_bytes[me];
      recv_off[q] = q * chunk_bytes[me];
    }
    gathered.resize(W * mine);
    all_to_all_bytes(x, send_bytes.data(), send_off.data(), gathered.data(), recv_bytes.data(), recv_off.data());
    // 2. the sum of my chunk, ranks added in order 0, 1, ..., W-1.
    sum.assign(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(mine));
    for (size_t q = 1; q < W; ++q) {
      const float* g = gathered.data() + q * mine;
      for (size_t i = 0; i < mine; ++i) sum[i] += g[i];
    }
    // 3. all-gather: every rank gets every summed chunk in place (a reduce-scatter keeps its own).
    if (gather)
      all_gather_v_bytes(sum.data(), mine * sizeof(float), x, chunk_bytes.data(), chunk_off.data());
    else if (mine > 0)
      std::memcpy(x + chunk_off[me] / sizeof(float), sum.data(), mine * sizeof(float));
  }
}

void Collective::reduce(const std::vector<Tensor*>& tensors, size_t bucket_floats, bool gather) {
  if (world() == 1) return;
  const CommScope scope;
  bucket_floats = std::max<size_t>(bucket_floats, 1);
  if (reduce_on_device(tensors, bucket_floats, gather)) return;
  // Host views of the tensors: the tensor itself on the CPU, a copy of a device tensor (written back).
  std::vector<Tensor> host(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor& t = *tensors[i];
    if (t.dtype() != DType::F32)
      throw Error(ErrorCode::RUNTIME_INTERNAL,
                  fmt::format("[collective] all-reduce of a {} tensor: only f32 is summed", dtype_name(t.dtype())));
    host[i] = t.device().type == DeviceType::CPU ? t : t.to(Device{});
  }
  // Buckets of up to bucket_floats: the tensors' values packed in order (a large tensor
  // spans several), summed, and unpacked. Where a tensor falls in a bucket does not change its sums.
  std::vector<float> bucket;
  bucket.reserve(bucket_floats);
  struct Piece {
    size_t tensor, offset, count;
  };
  std::vector<Piece> pieces;
  auto flush = [&] {
    if (bucket.empty()) return;
    reduce(bucket.data(), bucket.size(), bucket_floats, gather);
    size_t at = 0;
    for (const Piece& p : pieces) {
      std::memcpy(host[p.tensor].data<float>() + p.offset, bucket.data() + at, p.count * sizeof(float));
      at += p.count;
    }
    bucket.clear();
    pieces.clear();
  };
  for (size_t i = 0; i < host.size(); ++i) {
    const float* v = host[i].data<float>();
    const size_t n = static_cast<size_t>(host[i].numel());
    for (size_t off = 0; off < n;) {
      const size_t take = std::min(n - off, bucket_floats - bucket.size());
      pieces.push_back({i, off, take});
      bucket.insert(bucket.end(), v + off, v + off + take);
      off += take;
      if (bucket.size() == bucket_floats) flush();
    }
  }
  flush();
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i]->device().type != DeviceType::CPU) tensors[i]->copy_from(host[i]);
}

// Some of the tensors of a layout reduced now (overlap of the backward pass): the values of the
// tensors `which` at their places in the flat concatenation of `tensors`, each segment's chunk q
// owned by rank q as in reduce(): per segment, an all-to-all sends each rank the selected values
// of its chunk (in flat order), the owner adds the W copies in rank order, and with `gather` an
// all-gather returns every owner's sums in the same order. Each value's sum is the one the whole
// reduction gives it, bit for bit.
void Collective::reduce_part(const std::vector<Tensor*>& tensors, const std::vector<size_t>& which, bool gather,
                             size_t segment_floats) {
  if (world() == 1 || which.empty()) return;
  const CommScope scope;
  segment_floats = std::max<size_t>(segment_floats, 1);
  const size_t W = static_cast<size_t>(world()), me = static_cast<size_t>(rank());
  std::vector<size_t> start(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i];
    if (t.dtype() != DType::F32 || t.device().type != DeviceType::CPU)
      throw Error(ErrorCode::RUNTIME_INTERNAL, "[collective] a partial reduction sums f32 host tensors only");
    start[i + 1] = start[i] + static_cast<size_t>(t.numel());
  }
  std::vector<size_t> sel(which);
  std::sort(sel.begin(), sel.end());
  // The selected values of flat range [b, e), in flat order: (tensor, offset in it, count).
  struct Run {
    size_t tensor, offset, count;
  };
  auto runs_in = [&](size_t b, size_t e) {
    std::vector<Run> out;
    for (size_t i : sel) {
      const size_t lo = std::max(b, start[i]), hi = std::min(e, start[i + 1]);
      if (lo < hi) out.push_back({i, lo - start[i], hi - lo});
    }
    return out;
  };
  std::vector<size_t> send_bytes(W), send_off(W), recv_bytes(W), recv_off(W);
  std::vector<std::vector<Run>> chunk_runs(W);
  std::vector<float> send, gathered, sum;
  const size_t first = start[sel.front()], last = start[sel.back() + 1];
  for (size_t seg = first / segment_floats * segment_floats; seg < last; seg += segment_floats) {
    const size_t m = std::min(segment_floats, start.back() - seg);
    size_t at = 0;
    send.clear();
    for (size_t q = 0; q < W; ++q) {
      chunk_runs[q] = runs_in(seg + m * q / W, seg + m * (q + 1) / W);
      send_off[q] = at * sizeof(float);
      for (const Run& r : chunk_runs[q]) {
        const float* v = tensors[r.tensor]->data<float>() + r.offset;
        send.insert(send.end(), v, v + r.count);
        at += r.count;
      }
      send_bytes[q] = at * sizeof(float) - send_off[q];
    }
    if (at == 0) continue;  // nothing selected in this segment (the same on every rank)
    const size_t mine = send_bytes[me] / sizeof(float);
    for (size_t q = 0; q < W; ++q) {
      recv_bytes[q] = mine * sizeof(float);
      recv_off[q] = q * mine * sizeof(float);
    }
    gathered.resize(std::max<size_t>(1, W * mine));
    all_to_all_bytes(send.data(), send_bytes.data(), send_off.data(), gathered.data(), recv_bytes.data(),
                     recv_off.data());
    sum.assign(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(mine));
    for (size_t q = 1; q < W; ++q) {
      const float* g = gathered.data() + q * mine;
      for (size_t i = 0; i < mine; ++i) sum[i] += g[i];
    }
    auto unpack = [&](const float* values, size_t q) {
      for (const Run& r : chunk_runs[q]) {
        std::memcpy(tensors[r.tensor]->data<float>() + r.offset, values, r.count * sizeof(float));
        values += r.count;
      }
    };
    if (!gather) {
      unpack(sum.data(), me);
      continue;
    }
    all_gather_v_bytes(sum.data(), mine * sizeof(float), send.data(), send_bytes.data(), send_off.data());
    for (size_t q = 0; q < W; ++q) unpack(send.data() + send_off[q] / sizeof(float), q);
  }
}

std::vector<int64_t> Collective::all_gather(int64_t value) {
  std::vector<int64_t> out(static_cast<size_t>(world()));
  all_gather_bytes(&value, sizeof value, out.data());
  return out;
}

std::vector<double> Collective::all_gather(double value) {
  std::vector<double> out(static_cast<size_t>(world()));
  all_gather_bytes(&value, sizeof value, out.data());
  return out;
}

namespace {
// Every rank's `count` values of T, concatenated in rank order: the counts first, then one
// all-gather with them.
template <class T>
std::vector<T> gather_concat(Collective& c, const std::vector<T>& values) {
  if (c.world() == 1) return values;
  const CommScope scope;
  const std::vector<int64_t> counts = c.all_gather(static_cast<int64_t>(values.size()));
  std::vector<size_t> bytes(counts.size()), offsets(counts.size());
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    bytes[r] = static_cast<size_t>(counts[r]) * sizeof(T);
    offsets[r] = total * sizeof(T);
    total += static_cast<size_t>(counts[r]);
  }
  std::vector<T> out(total);
  if (total > 0)
    c.all_gather_v_bytes(values.data(), values.size() * sizeof(T), out.data(), bytes.data(), offsets.data());
  return out;
}
}  // namespace

std::vector<double> Collective::all_gather_concat(const std::vector<double>& values) {
  return gather_concat(*this, values);
}

std::vector<float> Collective::all_gather_concat(const std::vector<float>& values) {
  return gather_concat(*this, values);
}

double Collective::sum_in_rank_order(double value) {
  if (world() == 1) return value;
  double s = 0;
  bool first = true;
  for (double v : all_gather(value)) {
    s = first ? v : s + v;
    first = false;
  }
  return s;
}

bool Collective::any(bool value) {
  if (world() == 1) return value;
  for (int64_t v : all_gather(int64_t{value ? 1 : 0}))
    if (v) return true;
  return false;
}

std::string Collective::broadcast(const std::string& text, int root) {
  if (world() == 1) return text;
  const CommScope scope;
  int64_t n = static_cast<int64_t>(text.size());
  broadcast_bytes(&n, sizeof n, root);
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) broadcast_bytes(out.data(), out.size(), root);
  return out;
}

// ---- the single process ---------------------------------------------------------------------

namespace {

class SingleCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "single"; }
  std::string description() const override { return "one process"; }
  std::string host_name() override {
    char buf[256] = {0};
    if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
  }
  void barrier(double) override {}
  void broadcast_bytes(void*, size_t, int) override {}
  void all_gather_bytes(const void* send, size_t bytes, void* recv) override {
    if (bytes) std::memmove(recv, send, bytes);
  }
  void all_to_all_bytes(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                        const size_t*, const size_t* recv_offsets) override {
    if (send_bytes[0])
      std::memmove(static_cast<char*>(recv) + recv_offsets[0], static_cast<const char*>(send) + send_offsets[0],
                   send_bytes[0]);
  }
  void all_gather_v_bytes(const void* send, size_t bytes, void* recv, const size_t*,
                          const size_t* recv_offsets) override {
    if (bytes) std::memmove(static_cast<char*>(recv) + recv_offsets[0], send, bytes);
  }
};

// ---- the MPI plugin --------------------------------------------------------------------------

constexpr const char* kMpiPluginFile = "libbp_collective_mpi.so";

// Where this code lives (the backprop binary, or the Python package's extension module).
fs::path own_binary_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&launch_from_environment), &info) && info.dli_fname && *info.dli_fname) {
    std::error_code ec;
    fs::path p = fs::canonical(info.dli_fname, ec);
    if (!ec) return p.parent_path();
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

std::vector<std::string> plugin_candidates(const std::string& library) {
  if (!library.empty()) return {library};
  std::vector<std::string> out;
  const fs::path dir = own_binary_dir();
  if (!dir.empty()) {
    out.push_back((dir / kMpiPluginFile).string());                              // the build tree: build/
    out.push_back((dir / ".." / "lib" / "backprop" / kMpiPluginFile).string());  // installed: bin/ -> lib/backprop/
    out.push_back((dir / ".." / ".." / kMpiPluginFile).string());  // the Python package in build/python/backpropagate/
  }
  out.push_back(kMpiPluginFile);  // the loader's search path (LD_LIBRARY_PATH)
  return out;
}

struct LoadedPlugin {
  void* handle = nullptr;
  const bp_collective_plugin* api = nullptr;
  std::string path;
  std::string why;  // all that was tried, when nothing loaded
};

// RTLD_GLOBAL: Open MPI loads its own components with dlopen and they resolve libmpi's symbols
// globally; with RTLD_LOCAL they fail to load.
LoadedPlugin open_plugin(const std::string& library) {
  LoadedPlugin lp;
  std::vector<std::string> tried;
  for (const std::string& path : plugin_candidates(library)) {
    const bool is_path = path.find('/') != std::string::npos;
    std::error_code ec;
    if (is_path && !fs::exists(path, ec)) {
      tried.push_back(path + ": not found");
      continue;
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      tried.push_back(e ? std::string(e) : path + ": cannot be loaded");
      continue;
    }
    auto fn = reinterpret_cast<bp_collective_plugin_fn>(dlsym(h, BP_COLLECTIVE_PLUGIN_SYMBOL));
    const bp_collective_plugin* api = fn ? fn() : nullptr;
    if (!api || api->abi != BP_COLLECTIVE_PLUGIN_ABI) {
      tried.push_back(path + ": not a backprop collective plugin of ABI " + std::to_string(BP_COLLECTIVE_PLUGIN_ABI));
      dlclose(h);
      continue;
    }
    lp.handle = h;
    lp.api = api;
    lp.path = is_path ? fs::weakly_canonical(path, ec).string() : path;
    return lp;
  }
  std::string all;
  for (const auto& t : tried) all += (all.empty() ? "" : "; ") + t;
  lp.why = all;
  return lp;
}

class MpiCollective final : public Collective {
 public:
  MpiCollective(const bp_collective_plugin* api, std::string path) : api_(api), path_(std::move(path)) {
    char version[256] = {0};
    call("init", api_->init(&rank_, &world_, version, sizeof version, error_, sizeof error_));
    version_ = version;
    learn_peers();
    api_->set_wait_hook(&MpiCollective::wait_hook, this);
  }
  ~MpiCollective() override { api_->set_wait_hook(nullptr, nullptr); }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "mpi"; }
  std::string description() const override {
    return fmt::format("{}, {} ranks (plugin {})", version_.empty() ? "MPI" : version_, world_, path_);
  }
  std::string host_name() override { return host_; }
  void check_peers() override {
    if (const Peer* p = lost_peer()) throw rank_lost(*p, "");
  }
  // Each primitive is timed (CommScope) and counts the payload it sends to the other ranks.
  void barrier(double timeout_s) override {
    const CommScope scope;
    call("barrier", api_->barrier(timeout_s, error_, sizeof error_));
  }
  void broadcast_bytes(void* data, size_t bytes, int root) override {
    const CommScope scope;
    if (rank_ == root) CommScope::add_bytes(bytes * static_cast<uint64_t>(world_ - 1));
    call("broadcast", api_->broadcast(data, bytes, root, error_, sizeof error_));
  }
  void all_gather_bytes(const void* send, size_t bytes, void* recv) override {
    const CommScope scope;
    CommScope::add_bytes(bytes * static_cast<uint64_t>(world_ - 1));
    call("all-gather", api_->all_gather(send, bytes, recv, error_, sizeof error_));
  }
  void all_to_all_bytes(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                        const size_t* recv_bytes, const size_t* recv_offsets) override {
    const CommScope scope;
    uint64_t out = 0;
    for (int q = 0; q < world_; ++q)
      if (q != rank_) out += send_bytes[q];
    CommScope::add_bytes(out);
    call("all-to-all",
         api_->all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, error_, sizeof error_));
  }
  void all_gather_v_bytes(const void* send, size_t bytes, void* recv, const size_t* recv_bytes,
                          const size_t* recv_offsets) override {
    const CommScope scope;
    CommScope::add_bytes(bytes * static_cast<uint64_t>(world_ - 1));
    call("all-gather", api_->all_gather_v(send, bytes, recv, recv_bytes, recv_offsets, error_, sizeof error_));
  }
  void finalize() { call("finalize", api_->finalize(error_, sizeof error_)); }
  bool threads_may_communicate() const override { return api_->thread_level() >= 2; }

 private:
  // Another rank's process as every rank told at the start.
  struct Peer {
    int rank = 0;
    long pid = 0;
    long long start = -1;  // live_process_start: clock ticks since boot
    std::string host;
    bool checkable = false;  // on this host, and seen running with that start time at the start
  };
  struct PeerRecord {  // what each rank all-gathers about itself
    int64_t pid = 0;
    int64_t start = -1;
    char host[128] = {0};
  };

  void learn_peers() {
    char name[256] = {0};
    call("host_name", api_->host_name(name, sizeof name, error_, sizeof error_));
    host_ = name;
    PeerRecord me;
    me.pid = static_cast<int64_t>(::getpid());
    me.start = live_process_start(static_cast<long>(::getpid()));
    std::snprintf(me.host, sizeof me.host, "%s", name);
    std::vector<PeerRecord> all(static_cast<size_t>(world_));
    call("all-gather", api_->all_gather(&me, sizeof me, all.data(), error_, sizeof error_));
    for (int r = 0; r < world_; ++r) {
      const PeerRecord& pr = all[static_cast<size_t>(r)];
      Peer p;
      p.rank = r;
      p.pid = static_cast<long>(pr.pid);
      p.start = pr.start;
      p.host = std::string(pr.host, strnlen(pr.host, sizeof pr.host));
      // Same host name is not proof of one process table (containers): the peer must be visible
      // here, with its own start time, before its absence means anything.
      p.checkable = r != rank_ && p.host == host_ && p.start >= 0 && live_process_start(p.pid) == p.start;
      peers_.push_back(p);
    }
  }
  const Peer* lost_peer() const {
    for (const Peer& p : peers_)
      if (p.checkable && live_process_start(p.pid) != p.start) return &p;
    return nullptr;
  }
  static int wait_hook(void* context, double) {
    auto* self = static_cast<MpiCollective*>(context);
    self->lost_ = self->lost_peer();
    return self->lost_ ? 1 : 0;
  }
  Error rank_lost(const Peer& p, const std::string& during) const {
    return Error(
        ErrorCode::RUNTIME_DISTRIBUTED_RANK_LOST,
        fmt::format("[collective] rank {} of {} (pid {} on host {}) is gone: killed or crashed{}; rank {} "
                    "stops the run instead of waiting for it",
                    p.rank, world_, p.pid, p.host, during, rank_),
        {{"lost_rank", p.rank}, {"lost_host", p.host}, {"lost_pid", p.pid}, {"rank", rank_}, {"world", world_}});
  }
  void call(const char* what, int rc) {
    if (rc == 0) return;
    error_[sizeof error_ - 1] = 0;
    if (rc == 3 && lost_) throw rank_lost(*lost_, fmt::format(" ({} waited for it: {})", what, error_));
    throw Error(ErrorCode::RUNTIME_DISTRIBUTED_FAILED,
                fmt::format("[collective] {} on rank {} of {}: {}", what, rank_, world_, error_),
                {{"rank", rank_}, {"world", world_}, {"operation", what}});
  }
  const bp_collective_plugin* api_;
  std::string path_, version_, host_;
  int rank_ = 0, world_ = 1;
  std::vector<Peer> peers_;
  const Peer* lost_ = nullptr;
  char error_[1024] = {0};
};

std::mutex& process_mutex() {
  static std::mutex m;
  return m;
}
std::unique_ptr<Collective>& process_instance() {
  static std::unique_ptr<Collective> c;
  return c;
}

}  // namespace

std::unique_ptr<Collective> make_single_collective() {
  return std::make_unique<SingleCollective>();
}

PluginAvailability mpi_plugin_availability(const std::string& library) {
  PluginAvailability a;
  LoadedPlugin lp = open_plugin(library);
  a.available = lp.api != nullptr;
  a.path = lp.path;
  a.why = lp.why;
  // The handle stays open: Open MPI's libraries do not support being unloaded and loaded again.
  return a;
}

std::string find_mpirun() {
  std::string dirs = env("PATH") ? env("PATH") : "";
  dirs += ":/usr/bin:/usr/local/bin";
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    if (e > b) {
      const std::string cand = dirs.substr(b, e - b) + "/mpirun";
      if (::access(cand.c_str(), X_OK) == 0) return cand;
    }
    b = e + 1;
  }
  return {};
}

std::unique_ptr<Collective> load_mpi_collective(const std::string& library) {
  LoadedPlugin lp = open_plugin(library);
  if (!lp.api) {
    const LaunchInfo li = launch_from_environment();
    throw Error(ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
                fmt::format("[collective] {}, but the MPI collective plugin cannot be loaded ({})",
                            li.world > 1 ? fmt::format("launched by {} as {} processes", li.launcher, li.world)
                                         : std::string("MPI was asked for (training.distributed mpi)"),
                            lp.why),
                {{"plugin", kMpiPluginFile}, {"world", li.world}})
        .with_suggestion(
            "Install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and rebuild, so "
            "libbp_collective_mpi.so is built beside backprop; or name the plugin with "
            "training.mpi_library. `backprop info` says whether MPI is available.");
  }
  return std::make_unique<MpiCollective>(lp.api, lp.path);
}

Collective& process_collective(const std::string& mode, const std::string& library) {
  std::lock_guard<std::mutex> lock(process_mutex());
  auto& c = process_instance();
  if (c) return *c;
  const bool mpi = mode == "mpi" || (mode == "auto" && launch_from_environment().world > 1);
  c = mpi ? load_mpi_collective(library) : make_single_collective();
  return *c;
}

void finalize_process_collective() {
  std::lock_guard<std::mutex> lock(process_mutex());
  auto& c = process_instance();
  if (auto* m = dynamic_cast<MpiCollective*>(c.get())) m->finalize();
}

}  // namespace bp
