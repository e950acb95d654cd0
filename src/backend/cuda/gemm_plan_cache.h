// The cache of cuBLASLt plans (descriptors and the heuristic's algorithm) of the CUDA backend's GEMMs.
//
// Why: cublasLtMatmulAlgoGetHeuristic costs microseconds to tens of microseconds per call, and a
// training step makes hundreds of GEMMs of a few dozen distinct shapes (every layer repeats the
// same ones). Asked once per distinct call, the heuristic leaves the hot path after the first step
// of each batch shape.
//
// Key (GemmPlanKey): everything the heuristic's answer depends on, which is everything in the
// GemmDesc but alpha and beta (host scalars handed to cublasLtMatmul, never seen by the heuristic):
// the device, transposes, m/n/k, leading dimensions, batch count and strides (strides only with a
// batch: cublaslt_gemm.cpp sets them only then), the three types, the alignment class of each
// pointer (gemm_alignments: the MIN_ALIGNMENT preferences; an algorithm chosen for 256-byte
// aligned operands may fault on 4-byte aligned ones) and the workspace size (the MAX_WORKSPACE
// preference). GemmDesc has no epilogue; a field added to it must join the key (the static_assert
// below stops the build until someone decides).
// Value (Plan): what the backend keeps per key. The real build keeps the matmul and layout
// descriptors (they depend on the same fields) and the algorithm, or "none found" so that the
// failure repeats without a query; the simulation keeps what it chose the algorithm for.
//
// One cache per cuBLASLt handle, i.e. per host thread (the handle is thread_local in
// cublaslt_gemm.cpp), so no lock is taken on the GEMM path and a plan in use by one thread is never
// evicted by another. Bounded: least recently used plans go past `capacity` (their descriptors are
// destroyed). With packed batches the token count T, and so m or n, changes from micro-batch to
// micro-batch; each new T costs one query per distinct GEMM shape, and the default capacity holds
// the shapes of a few hundred distinct token counts.
// Plain C++ (no CUDA header): the real build and the simulation (sim/gemm_sim.cpp) share it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "backend/cuda/gemm_desc.h"

namespace bp::gemm {

// A GemmDesc is 2 flags, 9 sizes and strides, the batch, 3 types and 2 scalars. A new field changes
// the size: add it to gemm_plan_key if the heuristic sees it (an epilogue, a bias type), then here.
// alpha_beta_on_device: its value is not seen by the heuristic, but whether it is set is (the pointer
// mode is an attribute of the plan's matmul descriptor): the key has the mode.
static_assert(sizeof(GemmDesc) == 112, "GemmDesc changed: decide whether the new field belongs in GemmPlanKey");

struct GemmPlanKey {
  std::array<int64_t, 22> fields{};
  bool operator==(const GemmPlanKey& other) const { return fields == other.fields; }
};

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t f : key.fields) h = (h ^ static_cast<uint64_t>(f)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

inline GemmPlanKey gemm_plan_key(const GemmDesc& d, const GemmAlignments& al, size_t workspace_bytes, int device) {
  const bool batched = d.batch > 1;
  GemmPlanKey key;
  key.fields = {device,
                d.trans_a,
                d.trans_b,
                d.m,
                d.n,
                d.k,
                d.lda,
                d.ldb,
                d.ldc,
                d.batch,
                batched ? d.stride_a : 0,
                batched ? d.stride_b : 0,
                batched ? d.stride_c : 0,
                static_cast<int64_t>(d.a_type),
                static_cast<int64_t>(d.b_type),
                static_cast<int64_t>(d.c_type),
                al.a,
                al.b,
                al.c,
                al.d,
                static_cast<int64_t>(workspace_bytes),
                d.alpha_beta_on_device != nullptr};
  return key;
}

template <class Plan>
class GemmPlanCache {
 public:
  static constexpr size_t kDefaultCapacity = 4096;
  explicit GemmPlanCache(size_t capacity = kDefaultCapacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  GemmPlanCache(const GemmPlanCache&) = delete;
  GemmPlanCache& operator=(const GemmPlanCache&) = delete;

  // The plan of `key`: the cached one (now the most recently used), or a default-constructed Plan
  // filled in place by make(Plan&) (the heuristic query). When make throws, nothing is kept. The
  // reference stays valid until the next call on this cache.
  template <class Make>
  const Plan& find_or_make(const GemmPlanKey& key, Make&& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    ++misses_;
    lru_.emplace_front(std::piecewise_construct, std::forward_as_tuple(key), std::forward_as_tuple());
    try {
      make(lru_.front().second);
    } catch (...) {
      lru_.pop_front();
      throw;
    }
    index_.emplace(key, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
      ++evictions_;
    }
    return lru_.front().second;
  }

  void clear() {
    index_.clear();
    lru_.clear();
  }
  size_t size() const { return lru_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  using Entry = std::pair<GemmPlanKey, Plan>;
  size_t capacity_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<GemmPlanKey, typename std::list<Entry>::iterator, GemmPlanKeyHash> index_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace bp::gemm
