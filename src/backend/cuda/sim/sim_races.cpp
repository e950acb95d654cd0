// The CUDA simulation's race checks: the schedules and the cross-block write check (controls in
// cuda_sim.h; the scheduler in cuda_sim.cpp calls what sim_races.h declares).
//
// Schedules (cuda_sim.h, BP_SIM_SCHEDULE): the order of one round and of the blocks. Forward
// resumes the ready threads in thread order and runs the blocks in grid order; Reverse both
// backwards; Shuffle the blocks in a random order and, in each block, one of two at random:
// rounds of a fresh random permutation of the ready threads, each warp held back for the round
// with probability 1/2 (a GPU may delay any warp: one warp drifts a few meetings ahead of another),
// or warp-serial: the warps in a random order, each run alone until it waits at __syncthreads or
// ends (the largest skew: one warp passes all its shuffles and its writes to shared memory before
// another starts, which catches a scratch buffer reused without a leading barrier). All three are
// orders a GPU could produce, so a correct kernel gives the same result under each, up to the
// rounding of float atomics. A race shows up as a difference:
// - a thread reading shared memory that another thread writes with no barrier between reads the
//   new value in one order and the old one in the other: Forward runs lower threads first, so it
//   exposes a read of a higher thread's write, Reverse a read of a lower thread's write (thread 0
//   broadcasting through shared memory without __syncthreads, a total read before the last step
//   of a reduction has finished); Shuffle mixes both inside warps and between warps;
// - a kernel relying on block order (block N-1 summing partials the other blocks wrote, a chained
//   scan without look-back) reads unwritten memory under Reverse/Shuffle;
// - blocks storing different values to one element: the last block wins, a different one per order.
// Why schedules and not a shadow-memory detector: the kernels' loads and stores are plain C++, so
// watching them would mean instrumenting every access; running the same tests under three orders
// needs nothing but this loop, and the tests already compare with references. A "poison on
// __syncthreads" mode was not possible either: static __shared__ arrays are thread_local
// variables the scheduler cannot locate (dynamic shared memory is already NaN bytes at every
// block start). What no order can show is a lost update inside one segment (two threads or blocks
// doing a non-atomic `+=` on one address: the fibers never switch between its load and store, so
// integer sums stay exact and float sums only change their rounding order, exactly as atomics
// would). For blocks, the cross-block write check reports it; for two threads of one block,
// and for reads of a static __shared__ array before any write (it keeps the previous block's
// values), nothing here does.
//
// Cross-block write check (BP_SIM_CHECK_WRITES=1, set_write_check): a launch keeps a copy of each
// device allocation its kernel may write (the ones its non-const pointer arguments point into)
// and, after each block, compares: a byte the block changed that an earlier block of the launch
// had changed too is a race, unless an atomic touched it. It costs a pass over those allocations
// per block (unchanged 4 KiB chunks cost one memcmp), so it is for tests, off by default. Host
// memory passed straight to a kernel (not from cudaMalloc) is not watched.
#include "backend/cuda/sim/sim_races.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

namespace bp::sim {

namespace {

std::mutex g_mu;
std::optional<ScheduleChoice> g_schedule;                 // empty until the first launch reads BP_SIM_SCHEDULE
uint64_t g_schedule_launches = 0;                         // launches since the schedule was chosen
std::optional<bool> g_check_writes;                       // empty until the first launch reads BP_SIM_CHECK_WRITES
thread_local races::WriteCheck* g_write_check = nullptr;  // the launch running on this OS thread

std::string block_name(uint64_t linear, dim3 grid) {
  return "(" + std::to_string(linear % grid.x) + "," + std::to_string(linear / grid.x % grid.y) + "," +
         std::to_string(linear / (uint64_t{grid.x} * grid.y)) + ")";
}

}  // namespace

ScheduleChoice parse_schedule(const char* text) {
  const std::string s = text ? text : "";
  if (s.empty() || s == "forward") return {Schedule::Forward, 0};
  if (s == "reverse") return {Schedule::Reverse, 0};
  if (s == "shuffle") return {Schedule::Shuffle, 1};
  if (s.rfind("shuffle:", 0) == 0 && s.size() > 8 && s.size() <= 27 &&
      s.find_first_not_of("0123456789", 8) == std::string::npos)
    return {Schedule::Shuffle, std::stoull(s.substr(8))};
  throw std::invalid_argument("[cuda-sim] BP_SIM_SCHEDULE='" + s +
                              "' is not forward, reverse, shuffle or shuffle:SEED (a decimal number)");
}
ScheduleChoice current_schedule() {
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_schedule) g_schedule = parse_schedule(std::getenv("BP_SIM_SCHEDULE"));
  return *g_schedule;
}
ScheduleChoice set_schedule(ScheduleChoice choice) {
  const ScheduleChoice before = current_schedule();
  std::lock_guard<std::mutex> g(g_mu);
  g_schedule = choice;
  g_schedule_launches = 0;
  return before;
}

bool write_check_enabled() {
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_check_writes) {
    const char* env = std::getenv("BP_SIM_CHECK_WRITES");
    g_check_writes = env && std::string(env) == "1";
  }
  return *g_check_writes;
}
bool set_write_check(bool on) {
  const bool before = write_check_enabled();
  std::lock_guard<std::mutex> g(g_mu);
  g_check_writes = on;
  return before;
}
void sim_note_atomic(const void* p, size_t bytes) {
  if (g_write_check) g_write_check->note_atomic(p, bytes);
}

namespace races {

LaunchSchedule next_launch_schedule() {
  const ScheduleChoice choice = current_schedule();
  std::lock_guard<std::mutex> g(g_mu);
  return {choice.order, choice.seed * 0x9e3779b97f4a7c15ull + g_schedule_launches++};
}

BlockOrder::BlockOrder(Schedule order, uint64_t blocks, std::mt19937_64& rng) : order_(order), blocks_(blocks) {
  if (order != Schedule::Shuffle) return;
  permutation_.resize(blocks);
  std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
  std::shuffle(permutation_.begin(), permutation_.end(), rng);
}
uint64_t BlockOrder::at(uint64_t k) const {
  switch (order_) {
    case Schedule::Forward: return k;
    case Schedule::Reverse: return blocks_ - 1 - k;
    case Schedule::Shuffle: break;
  }
  return permutation_[k];
}

WriteCheck::WriteCheck(const std::vector<void*>& outputs) {
  for (void* p : outputs) {
    const auto [base, bytes] = allocation_containing(p);
    if (!base) continue;  // host memory: not watched
    bool known = false;
    for (const auto& w : watched_) known |= w.base == base;
    if (known) continue;
    Watched w;
    w.base = base;
    w.bytes = bytes;
    w.seen.assign(base, base + bytes);
    w.writer.assign(bytes, 0);
    watched_.push_back(std::move(w));
  }
  if (!watched_.empty()) g_write_check = this;
}
WriteCheck::~WriteCheck() {
  if (g_write_check == this) g_write_check = nullptr;
}

void WriteCheck::note_atomic(const void* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) atomic_bytes_.insert(reinterpret_cast<uintptr_t>(p) + i);
}

void WriteCheck::after_block(uint64_t linear, dim3 grid) {
  constexpr size_t kChunk = 4096;
  for (auto& w : watched_)
    for (size_t c0 = 0; c0 < w.bytes; c0 += kChunk) {
      const size_t c1 = std::min(w.bytes, c0 + kChunk);
      if (std::memcmp(w.base + c0, w.seen.data() + c0, c1 - c0) == 0) continue;
      for (size_t i = c0; i < c1; ++i) {
        if (w.base[i] == w.seen[i]) continue;
        w.seen[i] = w.base[i];
        const uint32_t before = w.writer[i];
        w.writer[i] = static_cast<uint32_t>(linear + 1);
        if (before == 0 || atomic_bytes_.count(reinterpret_cast<uintptr_t>(w.base + i))) continue;
        throw std::runtime_error("[cuda-sim] blocks " + block_name(before - 1, grid) + " and " +
                                 block_name(linear, grid) + " of one launch both changed byte " + std::to_string(i) +
                                 " of a " + std::to_string(w.bytes) +
                                 "-byte device allocation without an atomic: on a GPU the blocks run at once, so "
                                 "which value stays (or, for a +=, whether an update is lost) is a race");
      }
    }
}

}  // namespace races
}  // namespace bp::sim
