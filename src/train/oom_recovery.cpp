#include "train/oom_recovery.h"

#include <algorithm>
#include <cctype>
#include <new>

#include "core/error.h"

namespace bp {

static bool contains_ci(std::string_view hay, std::string_view needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  });
  return it != hay.end();
}

OomKind classify_oom(const std::exception& e) {
  if (dynamic_cast<const OutOfMemoryError*>(&e)) return OomKind::OutOfMemory;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return OomKind::Adjacent;
  if (auto* be = dynamic_cast<const Error*>(&e)) {
    // The safety monitor's low-memory signal: memory is running out, no allocation failed yet.
    if (be->code() == ErrorCode::RUNTIME_OOM_ADJACENT || be->code() == ErrorCode::RUNTIME_MEMORY_PRESSURE)
      return OomKind::Adjacent;
    if (be->code() == ErrorCode::RUNTIME_GPU_OOM || be->code() == ErrorCode::RUNTIME_CPU_OOM)
      return OomKind::OutOfMemory;
  }
  std::string_view w = e.what();
  if (contains_ci(w, "CUBLAS_STATUS_ALLOC_FAILED") || contains_ci(w, "CUDNN_STATUS_NOT_INITIALIZED") ||
      contains_ci(w, "out of memory"))
    return OomKind::Adjacent;
  return OomKind::None;
}

OomRecovery::OomRecovery(int64_t batch_seqs, int64_t micro_seqs, bool enabled, Allocator& allocator,
                         int max_failures_at_one)
    : batch_seqs_(batch_seqs),
      micro_seqs_(std::clamp<int64_t>(micro_seqs, 1, std::max<int64_t>(1, batch_seqs))),
      enabled_(enabled),
      allocator_(allocator),
      max_failures_at_one_(max_failures_at_one) {}

void OomRecovery::set_micro_seqs(int64_t m) {
  micro_seqs_ = std::clamp<int64_t>(m, 1, std::max<int64_t>(1, batch_seqs_));
}

void OomRecovery::run_step(int64_t n_seqs, const std::function<void(int64_t, int64_t)>& run_micro,
                           const std::function<void()>& reset, const std::function<void(const OomEvent&)>& on_event) {
  int failures_at_one = 0;
  for (;;) {
    try {
      for (int64_t b = 0; b < n_seqs; b += micro_seqs_) run_micro(b, std::min(n_seqs, b + micro_seqs_));
      return;
    } catch (const std::exception& e) {
      OomKind kind = classify_oom(e);
      if (kind == OomKind::None) throw;
      OomEvent ev;
      ev.kind = kind;
      ev.message = e.what();
      ev.micro_seqs_before = micro_seqs_;
      ev.memory = allocator_.stats();
      reset();
      allocator_.empty_cache();
      nlohmann::json snapshot = {{"bytes_in_use", ev.memory.bytes_in_use},
                                 {"bytes_peak", ev.memory.bytes_peak},
                                 {"bytes_cached", ev.memory.bytes_cached},
                                 {"bytes_limit", ev.memory.bytes_limit},
                                 {"bytes_total", ev.memory.bytes_total},
                                 {"micro_batch_seqs", micro_seqs_},
                                 {"oom_kind", kind == OomKind::Adjacent ? "adjacent" : "oom"}};
      if (!enabled_)
        throw Error(
            out_of_memory_code(allocator_.device().type == DeviceType::CPU),
            fmt::format("[train] out of memory with OOM recovery off (--no-oom-recovery): {} "
                        "[micro-batch {} sequences; in use {}, peak {}, limit {}]",
                        ev.message, micro_seqs_, format_bytes(ev.memory.bytes_in_use),
                        format_bytes(ev.memory.bytes_peak),
                        ev.memory.bytes_limit == kNoLimit ? std::string("none") : format_bytes(ev.memory.bytes_limit)),
            snapshot);
      if (relief_) ev.relief = relief_();
      if (!ev.relief.empty()) {
        ++recoveries_;
        ev.micro_seqs_after = micro_seqs_;
        ev.accum_after = accumulation();
        if (on_event) on_event(ev);
        continue;
      }
      if (micro_seqs_ == 1) {
        ++failures_at_one;
        if (failures_at_one >= max_failures_at_one_)
          throw Error(ErrorCode::RUNTIME_OOM_RECOVERY_EXHAUSTED,
                      fmt::format("[train] out of memory {} times in a row at one sequence per micro-batch: {}",
                                  failures_at_one, ev.message),
                      snapshot);
      }
      micro_seqs_ = std::max<int64_t>(1, micro_seqs_ / 2);
      ++recoveries_;
      ev.micro_seqs_after = micro_seqs_;
      ev.accum_after = accumulation();
      ev.consecutive_at_one = failures_at_one;
      if (on_event) on_event(ev);
    }
  }
}

}  // namespace bp
