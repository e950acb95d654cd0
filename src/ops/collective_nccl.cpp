// The NCCL collective (collective_nccl.h).
#include "ops/collective_nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/nccl.h"
#include "ops/elementwise.h"

namespace bp {

namespace {

// cudaStreamQuery of the CUDA runtime the process has loaded (the CUDA backend links libcudart):
// 0 cudaSuccess (idle), 600 cudaErrorNotReady (still working), else an error.
using StreamQueryFn = int (*)(void* stream);
StreamQueryFn stream_query() {
  static const auto fn = reinterpret_cast<StreamQueryFn>(dlsym(RTLD_DEFAULT, "cudaStreamQuery"));
  return fn;
}

Tensor flat(const Tensor& t) {
  return t.reshape(Shape{t.numel()});
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(Collective& host, const NcclApi& api, Device device) : host_(host), api_(api), device_(device) {
    if (!stream_query())
      throw Error(ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
                  "[collective] NCCL needs the CUDA runtime (cudaStreamQuery), which this process has not loaded");
    NcclUniqueId id{};
    if (host_.rank() == 0) check(api_.get_unique_id(&id), "ncclGetUniqueId");
    host_.broadcast_bytes(&id, sizeof id, 0);  // the bootstrap over MPI
    check(api_.comm_init_rank(&comm_, host_.world(), id, host_.rank()), "ncclCommInitRank");
  }
  ~NcclCollective() override {
    if (!comm_) return;
    if (failed_)
      api_.comm_abort(comm_);
    else
      api_.comm_destroy(comm_);
  }
  int rank() const override { return host_.rank(); }
  int world() const override { return host_.world(); }
  std::string name() const override { return "nccl"; }
  std::string description() const override {
    return fmt::format("NCCL {} ({}) on {}, bootstrapped over {}", nccl_version_text(api_.version), api_.path,
                       device_.name(), host_.description());
  }
  std::string host_name() override { return host_.host_name(); }
  void check_peers() override { host_.check_peers(); }
  void barrier(double timeout_s) override { host_.barrier(timeout_s); }
  void broadcast_bytes(void* data, size_t bytes, int root) override { host_.broadcast_bytes(data, bytes, root); }
  void all_gather_bytes(const void* send, size_t bytes, void* recv) override {
    host_.all_gather_bytes(send, bytes, recv);
  }
  void all_to_all_bytes(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                        const size_t* recv_bytes, const size_t* recv_offsets) override {
    host_.all_to_all_bytes(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  }
  void all_gather_v_bytes(const void* send, size_t bytes, void* recv, const size_t* recv_bytes,
                          const size_t* recv_offsets) override {
    host_.all_gather_v_bytes(send, bytes, recv, recv_bytes, recv_offsets);
  }

 protected:
  // The tensors' values packed in order into device buckets of bucket_floats (as the host path
  // packs them), each reduced by steps 1-3 of collective_nccl.h, and unpacked.
  bool reduce_on_device(const std::vector<Tensor*>& tensors, size_t bucket_floats, bool gather) override {
    if (tensors.empty() || tensors[0]->device() != device_) return false;
    for (const Tensor* t : tensors)
      if (t->device() != device_ || t->dtype() != DType::F32)
        throw Error(ErrorCode::RUNTIME_INTERNAL,
                    "[collective] NCCL reduction of tensors on several devices or not f32: every gradient must be an "
                    "f32 tensor on the run's device");
    struct Piece {
      size_t tensor;
      int64_t offset, count;
    };
    std::vector<Piece> pieces;
    int64_t total = 0;
    for (const Tensor* t : tensors) total += t->numel();
    // Scratch on the card: one bucket (at most the gradients' size) and its chunk's W copies.
    Tensor bucket = Tensor::empty(Shape{std::max<int64_t>(1, std::min(total, static_cast<int64_t>(bucket_floats)))},
                                  DType::F32, device_);
    int64_t filled = 0;
    auto flush = [&] {
      if (filled == 0) return;
      reduce_bucket(bucket.rows(0, filled), gather);
      int64_t at = 0;
      for (const Piece& p : pieces) {
        flat(*tensors[p.tensor]).rows(p.offset, p.offset + p.count).copy_from(bucket.rows(at, at + p.count));
        at += p.count;
      }
      pieces.clear();
      filled = 0;
    };
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t n = tensors[i]->numel();
      for (int64_t off = 0; off < n;) {
        const int64_t take = std::min(n - off, static_cast<int64_t>(bucket_floats) - filled);
        bucket.rows(filled, filled + take).copy_from(flat(*tensors[i]).rows(off, off + take));
        pieces.push_back({i, off, take});
        filled += take;
        off += take;
        if (filled == static_cast<int64_t>(bucket_floats)) flush();
      }
    }
    flush();
    wait("the gradient reduction");
    return true;
  }

 private:
  void reduce_bucket(Tensor x, bool gather) {
    const auto W = static_cast<size_t>(world()), me = static_cast<size_t>(rank());
    const auto m = static_cast<size_t>(x.numel());
    auto chunk = [&](size_t q) {
      return std::pair<int64_t, int64_t>{static_cast<int64_t>(m * q / W), static_cast<int64_t>(m * (q + 1) / W)};
    };
    const auto [mb, me_end] = chunk(me);
    const int64_t mine = me_end - mb;
    Tensor copies = Tensor::empty(Shape{std::max<int64_t>(1, static_cast<int64_t>(W) * mine)}, DType::F32, device_);
    // 1. chunk q of this rank to rank q; rank q's copy of this rank's chunk into slot q.
    copies.rows(static_cast<int64_t>(me) * mine, static_cast<int64_t>(me + 1) * mine).copy_from(x.rows(mb, me_end));
    check(api_.group_start(), "ncclGroupStart");
    uint64_t sent = 0;  // the payload to the other ranks (CommScope: the step records' comm_bytes)
    for (size_t q = 0; q < W; ++q) {
      if (q == me) continue;
      const auto [b, e] = chunk(q);
      sent += static_cast<uint64_t>(e - b) * sizeof(float);
      if (e > b)
        check(api_.send(x.kernel_data<float>() + b, e - b, kNcclFloat32, static_cast<int>(q), comm_, nullptr),
              "ncclSend");
      if (mine > 0)
        check(api_.recv(copies.kernel_data<float>() + q * static_cast<size_t>(mine), static_cast<size_t>(mine),
                        kNcclFloat32, static_cast<int>(q), comm_, nullptr),
              "ncclRecv");
    }
    check(api_.group_end(), "ncclGroupEnd");
    CommScope::add_bytes(sent);
    // 2. the rank-ordered sum of this rank's chunk, into its place in x.
    if (mine > 0) {
      Tensor sum = x.rows(mb, me_end);
      sum.copy_from(copies.rows(0, mine));
      for (size_t q = 1; q < W; ++q)
        add_inplace(sum, copies.rows(static_cast<int64_t>(q) * mine, static_cast<int64_t>(q + 1) * mine));
    }
    if (!gather) return;
    // 3. every rank's summed chunk to every rank, in place.
    CommScope::add_bytes(static_cast<uint64_t>(mine) * sizeof(float) * (W - 1));
    check(api_.group_start(), "ncclGroupStart");
    for (size_t q = 0; q < W; ++q) {
      const auto [b, e] = chunk(q);
      if (e > b)
        check(api_.broadcast(x.kernel_data<float>() + b, x.kernel_data<float>() + b, static_cast<size_t>(e - b),
                             kNcclFloat32, static_cast<int>(q), comm_, nullptr),
              "ncclBroadcast");
    }
    check(api_.group_end(), "ncclGroupEnd");
  }

  // Until the default stream is idle; NCCL's asynchronous errors and a lost peer end the wait.
  void wait(const char* what) {
    using clock = std::chrono::steady_clock;
    auto last_peer_check = clock::now();
    for (;;) {
      const int q = stream_query()(nullptr);
      if (q == 0) return;
      if (q != 600) {
        failed_ = true;
        throw Error(ErrorCode::RUNTIME_DISTRIBUTED_FAILED,
                    fmt::format("[collective] CUDA error {} on rank {} during {} over NCCL", q, rank(), what),
                    {{"rank", rank()}, {"world", world()}});
      }
      NcclResult async = 0;
      if (api_.comm_get_async_error(comm_, &async) == 0 && async != 0 && async != 7) fail(async, what);
      if (clock::now() - last_peer_check >= std::chrono::milliseconds(100)) {
        last_peer_check = clock::now();
        try {
          host_.check_peers();
        } catch (...) {
          failed_ = true;  // the destructor aborts the communicator: the kernels waiting for the peer end
          throw;
        }
      }
      ::usleep(50);
    }
  }
  void check(NcclResult r, const char* what) {
    if (r != 0 && r != 7) fail(r, what);
  }
  [[noreturn]] void fail(NcclResult r, const char* what) {
    failed_ = true;
    throw Error(ErrorCode::RUNTIME_DISTRIBUTED_FAILED,
                fmt::format("[collective] {} on rank {} of {}: NCCL error {} ({})", what, rank(), world(), r,
                            api_.get_error_string ? api_.get_error_string(r) : "?"),
                {{"rank", rank()}, {"world", world()}, {"operation", what}})
        .with_suggestion(
            "Each rank needs its own GPU: under mpirun or srun give every rank one (CUDA_VISIBLE_DEVICES per "
            "rank; backprop sets it from the launcher's local rank when it is unset). NCCL_DEBUG=INFO says more.");
  }

  Collective& host_;
  const NcclApi& api_;
  Device device_;
  NcclComm comm_ = nullptr;
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(Collective& host, Device device, const std::string& library) {
  std::string why;
  const NcclApi* api = load_nccl(library, &why);
  if (!api)
    throw Error(
        ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
        fmt::format("[collective] NCCL cannot be loaded for the data-parallel run on {} ({})", device.name(), why),
        {{"library", library.empty() ? "libnccl.so.2" : library}})
        .with_suggestion(
            "Install NCCL (it comes with the CUDA toolkit's libnccl2 package, or `apt-get install libnccl2`), "
            "or name it with training.nccl_library; training.nccl_library none sends the gradients through the "
            "host over MPI instead. `backprop info` says whether NCCL loads.");
  return std::make_unique<NcclCollective>(host, *api, device);
}

}  // namespace bp
