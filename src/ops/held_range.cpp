// See held_range.h.
#include "ops/held_range.h"

#include <cmath>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "ops/device_compute.h"
#include "ops/dispatch.h"

namespace bp::ops {

namespace {

// One entry per device address a weight was checked at; valid while the storage it was computed
// for lives (the token) and the view is the same (type and shape).
struct RangeEntry {
  std::weak_ptr<const void> storage;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  float abs_max = 0.0f;
};

bool same_storage(const std::weak_ptr<const void>& a, const std::weak_ptr<const void>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

std::mutex g_mu;
std::unordered_map<const void*, RangeEntry> g_checked;
constexpr size_t kPruneAbove = 4096;  // entries of freed weights are dropped when the map grows past this

}  // namespace

float held_abs_max(const Tensor& W) {
  BP_CHECK(W.rank() == 2, "[held_abs_max] W must be a matrix, got {}", W.describe());
  const cpu::HeldMatrix m = held_matrix(W);
  if (W.device().type == DeviceType::CPU) return kernels(W).held_abs_max(m);
  const std::weak_ptr<const void> token = W.storage_token();
  {
    std::lock_guard<std::mutex> g(g_mu);
    const auto it = g_checked.find(m.data);
    if (it != g_checked.end() && !it->second.storage.expired() && same_storage(it->second.storage, token) &&
        it->second.type == m.type && it->second.rows == m.rows && it->second.cols == m.cols)
      return it->second.abs_max;
  }
  const float abs_max = kernels(W).held_abs_max(m);
  std::lock_guard<std::mutex> g(g_mu);
  if (g_checked.size() > kPruneAbove)
    std::erase_if(g_checked, [](const auto& kv) { return kv.second.storage.expired(); });
  g_checked[m.data] = RangeEntry{token, m.type, m.rows, m.cols, abs_max};
  return abs_max;
}

bool held_outside_f16(const Tensor& W) {
  if (W.dtype() == DType::F32 || W.device().type != DeviceType::CUDA || W.numel() == 0) return false;
  if (!cuda_frozen_gemms_in_f16()) return false;
  return !(held_abs_max(W) < kF16OverflowThreshold);  // Inf and NaN too: f32 carries them as they are
}

cpu::HeldMatrix held_gemm_matrix(const Tensor& W) {
  cpu::HeldMatrix m = held_matrix(W);
  m.f32_panels = held_outside_f16(W);
  return m;
}

}  // namespace bp::ops
