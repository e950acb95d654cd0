// The CUDA simulation's scheduler and runtime (see cuda_sim.h for what is modelled and why).
//
// Scheduler: one block at a time. Each thread of the block is a fiber with its own stack. The
// scheduler resumes every fiber that is ready, in thread order, until it finishes or stops at a
// meeting point (a block barrier or a warp meeting); then it releases whole warps whose live lanes
// all wait at a warp meeting, or else the whole block when all live threads wait at __syncthreads.
// Anything else (some threads at a barrier that others exited without reaching, or a warp waiting
// for lanes stuck at a block barrier) is a deadlock on a GPU and an error here.
//
// Schedules (cuda_sim.h, BP_SIM_SCHEDULE): the order of one round and of the blocks. Forward
// resumes the ready threads in thread order and runs the blocks in grid order; Reverse both
// backwards; Shuffle a fresh random permutation of the ready threads each round, holding back each
// warp for the round with probability 1/2 (a GPU may delay any warp: one warp can then run several
// meetings ahead of another), and the blocks in a random order. All three are orders a GPU could
// produce, so a correct kernel gives the same result under each, up to the rounding of float
// atomics. A race shows up as a difference:
// - a thread reading shared memory that another thread writes with no barrier between reads the
//   new value in one order and the old one in the other: Forward runs lower threads first, so it
//   exposes a read of a higher thread's write, Reverse a read of a lower thread's write (thread 0
//   broadcasting through shared memory without __syncthreads, a total read before the last step
//   of a reduction has finished); Shuffle mixes both inside warps and between warps;
// - a kernel relying on block order (block N-1 summing partials the other blocks wrote, a chained
//   scan without look-back) reads unwritten memory under Reverse/Shuffle;
// - blocks storing different values to one element: the last block wins, a different one per order.
// Why schedules and not a shadow-memory detector: the kernels' loads and stores are plain C++, so
// watching them would mean instrumenting every access; running the same test under three orders
// needs nothing but this loop, and the tests already compare with references. What it cannot show:
// a lost update inside one segment (two threads or blocks doing a non-atomic `+=` on one address,
// as the fibers never switch between its load and store: integer sums stay exact, float sums only
// change their rounding order, exactly as atomics would), and reads of uninitialised static
// __shared__ arrays (they keep the previous block's values; dynamic shared memory is NaN bytes at
// every block start).
//
// Fiber switch: on x86-64 a dozen instructions (bp_sim_switch_stack below: callee-saved
// registers, MXCSR and the x87 control word); glibc's swapcontext makes a sigprocmask system call
// per switch, which made a 1,000-block reduction take seconds. Elsewhere, under AddressSanitizer
// (which follows swapcontext but not a hand-made switch), or with -DBP_SIM_UCONTEXT: ucontext.
#include "backend/cuda/sim/cuda_sim.h"

#include <sys/mman.h>
#include <ucontext.h>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(BP_SIM_UCONTEXT)
#define BP_SIM_ASM_SWITCH 1
// void bp_sim_switch_stack(void** save_sp, void* load_sp): saves this context on the current stack
// and its stack pointer in *save_sp, then resumes the context saved at load_sp.
asm(R"(
.text
.globl bp_sim_switch_stack
.type bp_sim_switch_stack,@function
bp_sim_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size bp_sim_switch_stack,.-bp_sim_switch_stack
.section .note.GNU-stack,"",@progbits
.text
)");
extern "C" void bp_sim_switch_stack(void** save_sp, void* load_sp);
#endif

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace bp::sim {

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

constexpr size_t kFiberStackBytes = 256 * 1024;

enum class FiberState { Ready, AtBlockBarrier, AtWarpMeeting, Done };

// A suspended execution context: a saved stack pointer (asm switch) or a ucontext.
struct Context {
#ifdef BP_SIM_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

void switch_context(Context& from, Context& to) {
#ifdef BP_SIM_ASM_SWITCH
  bp_sim_switch_stack(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

// Prepares `ctx` to start entry() on the given stack at its first switch.
void start_context(Context& ctx, char* stack, size_t bytes, void (*entry)()) {
#ifdef BP_SIM_ASM_SWITCH
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top - 16);  // entry's return address: entry starts as if called
  slot[1] = 0;                                         // a null "caller" ends backtraces
  slot[0] = reinterpret_cast<uint64_t>(entry);
  uint64_t* frame = slot - 7;  // 6 callee-saved registers and the MXCSR / x87 control word slot
  for (int i = 1; i < 7; ++i) frame[i] = 0;
  uint32_t mxcsr;
  uint16_t fpu_cw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  frame[0] = mxcsr | (uint64_t{fpu_cw} << 32);
  ctx.sp = frame;
#else
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack;
  ctx.uc.uc_stack.ss_size = bytes;
  ctx.uc.uc_link = nullptr;
  makecontext(&ctx.uc, entry, 0);
#endif
}

struct Fiber {
  Context context;
  char* stack = nullptr;
  FiberState state = FiberState::Ready;
  dim3 thread_index;
};

struct BlockRun {
  Context scheduler;
  std::vector<Fiber> fibers;
  int current = 0;
  const std::function<void()>* body = nullptr;
  std::vector<uint64_t> warp_slots;
  std::vector<unsigned char> dynamic_shared;
  std::exception_ptr error;
  Schedule order = Schedule::Forward;
  std::mt19937_64 rng;     // Shuffle: this launch's permutations
  std::vector<int> round;  // the fibers the current round resumes, in order
};

thread_local BlockRun* g_block = nullptr;
// Fiber stacks are kept between launches (mmap'd: pages are committed only when touched).
thread_local std::vector<char*> g_stacks;

char* fiber_stack(size_t i) {
  while (g_stacks.size() <= i) {
    void* p = mmap(nullptr, kFiberStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("[cuda-sim] cannot map a fiber stack");
    g_stacks.push_back(static_cast<char*>(p));
  }
  return g_stacks[i];
}

void fiber_main() {
  BlockRun* run = g_block;
  try {
    (*run->body)();
  } catch (...) {
    if (!run->error) run->error = std::current_exception();
  }
  run->fibers[run->current].state = FiberState::Done;
  switch_context(run->fibers[run->current].context, run->scheduler);
}

// Suspends the current fiber in `state` until the scheduler releases it.
void suspend(FiberState state) {
  BlockRun* run = g_block;
  if (!run) throw std::logic_error("[cuda-sim] a device intrinsic was called outside a kernel launch");
  Fiber& f = run->fibers[run->current];
  f.state = state;
  switch_context(f.context, run->scheduler);
  // Resumed: restore this thread's index (the scheduler set it, but be explicit).
  threadIdx = run->fibers[run->current].thread_index;
}

int threads_per_block() {
  return static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}

// Releases what can be released; returns false on a deadlock.
bool release_waiters(BlockRun& run) {
  const int n = static_cast<int>(run.fibers.size());
  bool released = false;
  for (int w0 = 0; w0 < n; w0 += warpSize) {
    int w1 = std::min(n, w0 + warpSize);
    bool any_waiting = false, all_waiting = true;
    for (int i = w0; i < w1; ++i) {
      FiberState s = run.fibers[i].state;
      any_waiting |= s == FiberState::AtWarpMeeting;
      all_waiting &= s == FiberState::AtWarpMeeting;
    }
    if (any_waiting && all_waiting) {
      for (int i = w0; i < w1; ++i) run.fibers[i].state = FiberState::Ready;
      released = true;
    }
  }
  if (released) return true;
  int at_barrier = 0, done = 0;
  for (auto& f : run.fibers) {
    at_barrier += f.state == FiberState::AtBlockBarrier;
    done += f.state == FiberState::Done;
  }
  if (at_barrier == n) {
    for (auto& f : run.fibers) f.state = FiberState::Ready;
    return true;
  }
  (void)done;
  return false;
}

// The fibers one round resumes, in the order of the launch's schedule (a fiber that is not Ready
// when its turn comes is skipped).
void plan_round(BlockRun& run) {
  const int n = static_cast<int>(run.fibers.size());
  run.round.resize(n);
  if (run.order != Schedule::Shuffle) {
    std::iota(run.round.begin(), run.round.end(), 0);
    if (run.order == Schedule::Reverse) std::reverse(run.round.begin(), run.round.end());
    return;
  }
  run.round.clear();
  const uint64_t warps_run = run.rng();  // bit w: warp w runs this round (at most 32 warps)
  for (int i = 0; i < n; ++i)
    if (run.fibers[i].state == FiberState::Ready && (warps_run >> (i / warpSize) & 1u)) run.round.push_back(i);
  if (run.round.empty())  // every warp with a ready lane was held back: run them all instead
    for (int i = 0; i < n; ++i)
      if (run.fibers[i].state == FiberState::Ready) run.round.push_back(i);
  std::shuffle(run.round.begin(), run.round.end(), run.rng);
}

std::string deadlock_message(const BlockRun& run) {
  int at_barrier = 0, at_warp = 0, done = 0;
  for (auto& f : run.fibers) {
    at_barrier += f.state == FiberState::AtBlockBarrier;
    at_warp += f.state == FiberState::AtWarpMeeting;
    done += f.state == FiberState::Done;
  }
  return "[cuda-sim] block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
         std::to_string(blockIdx.z) + ") deadlocks: " + std::to_string(at_barrier) +
         " threads wait at __syncthreads, " + std::to_string(at_warp) + " at a warp shuffle/vote, " +
         std::to_string(done) +
         " exited (every thread of a block must reach each barrier, every lane of a warp each shuffle)";
}

void run_block(BlockRun& run) {
  const int n = threads_per_block();
  run.fibers.assign(n, Fiber{});
  for (int i = 0; i < n; ++i) {
    Fiber& f = run.fibers[i];
    f.thread_index = dim3(i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y));
    f.stack = fiber_stack(i);
    start_context(f.context, f.stack, kFiberStackBytes, fiber_main);
  }
  std::fill(run.dynamic_shared.begin(), run.dynamic_shared.end(), static_cast<unsigned char>(0xff));  // NaN bytes
  for (;;) {
    plan_round(run);
    for (int i : run.round) {
      Fiber& f = run.fibers[i];
      if (f.state == FiberState::Ready) {
        run.current = i;
        threadIdx = f.thread_index;
        switch_context(run.scheduler, f.context);
      }
    }
    if (run.error) std::rethrow_exception(run.error);
    bool all_done = true, any_ready = false;  // a fiber held back this round is still Ready
    for (const Fiber& f : run.fibers) {
      all_done &= f.state == FiberState::Done;
      any_ready |= f.state == FiberState::Ready;
    }
    if (all_done) return;
    if (!release_waiters(run) && !any_ready) throw std::runtime_error(deadlock_message(run));
  }
}

// ---- schedules ----
std::mutex g_schedule_mu;
std::optional<ScheduleChoice> g_schedule;  // empty until the first launch reads BP_SIM_SCHEDULE
uint64_t g_schedule_launches = 0;          // launches since the schedule was chosen: Shuffle's stream

// The schedule of the launch starting now and the seed of its permutations (a launch's shuffles
// depend on the seed and on how many launches came since the schedule was set, not on the tests
// that ran before: set_schedule, then the same launches, gives the same orders).
std::pair<ScheduleChoice, uint64_t> next_launch_schedule() {
  const ScheduleChoice choice = current_schedule();
  std::lock_guard<std::mutex> g(g_schedule_mu);
  return {choice, choice.seed * 0x9e3779b97f4a7c15ull + g_schedule_launches++};
}

// Block k of a launch in the schedule's order, as a linear index x + gx·(y + gy·z).
struct BlockOrder {
  Schedule order;
  uint64_t blocks;
  std::vector<uint64_t> permutation;  // Shuffle only
  uint64_t at(uint64_t k) const {
    switch (order) {
      case Schedule::Forward: return k;
      case Schedule::Reverse: return blocks - 1 - k;
      case Schedule::Shuffle: break;
    }
    return permutation[k];
  }
};

BlockOrder block_order(Schedule order, uint64_t blocks, std::mt19937_64& rng) {
  BlockOrder b{order, blocks, {}};
  if (order == Schedule::Shuffle) {
    b.permutation.resize(blocks);
    std::iota(b.permutation.begin(), b.permutation.end(), uint64_t{0});
    std::shuffle(b.permutation.begin(), b.permutation.end(), rng);
  }
  return b;
}

// ---- runtime state ----
std::mutex g_mu;
std::map<void*, size_t> g_allocations;
size_t g_budget = size_t{16} << 30;
size_t g_in_use = 0;
int g_cc_major = 8, g_cc_minor = 0;
cudaError_t g_last_error = cudaSuccess;
cudaError_t g_injected = cudaSuccess;
std::atomic<uint64_t> g_launches{0};
std::map<const void*, size_t> g_max_dynamic_shared;  // cudaFuncSetAttribute opt-ins, per kernel

cudaError_t fail(cudaError_t e) {
  std::lock_guard<std::mutex> g(g_mu);
  g_last_error = e;
  return e;
}

}  // namespace

int sim_lane() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
}
uint64_t* sim_warp_slots() {
  BlockRun* run = g_block;
  if (!run) throw std::logic_error("[cuda-sim] a warp intrinsic was called outside a kernel launch");
  return run->warp_slots.data() + (run->current / warpSize) * warpSize;
}
void sim_warp_meet() {
  suspend(FiberState::AtWarpMeeting);
}
void __syncthreads() {
  suspend(FiberState::AtBlockBarrier);
}
void* sim_dynamic_shared() {
  return g_block ? g_block->dynamic_shared.data() : nullptr;
}
void sim_record_error(cudaError_t e) {
  fail(e);
}

unsigned __ballot_sync(unsigned, int predicate) {
  uint64_t* slots = sim_warp_slots();
  slots[sim_lane()] = predicate ? 1 : 0;
  sim_warp_meet();
  BlockRun* run = g_block;
  int warp0 = (run->current / warpSize) * warpSize;
  int lanes = std::min(warpSize, static_cast<int>(run->fibers.size()) - warp0);
  unsigned bits = 0;
  for (int i = 0; i < lanes; ++i)
    if (slots[i]) bits |= 1u << i;
  sim_warp_meet();
  return bits;
}

cudaError_t sim_set_max_dynamic_shared(const void* kernel, int bytes) {
  if (!kernel || bytes < 0 || static_cast<size_t>(bytes) > kSimMaxOptInDynamicSharedBytes)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(g_mu);
  g_max_dynamic_shared[kernel] = static_cast<size_t>(bytes);
  return cudaSuccess;
}

namespace {

// What a launch of `kernel` may use: 48 KiB, or its opt-in when larger.
size_t dynamic_shared_limit(const void* kernel) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = kernel ? g_max_dynamic_shared.find(kernel) : g_max_dynamic_shared.end();
  return it == g_max_dynamic_shared.end() ? kSimDefaultDynamicSharedBytes
                                          : std::max(kSimDefaultDynamicSharedBytes, it->second);
}

bool launch_configuration_ok(dim3 grid, dim3 block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const bool block_ok = threads >= 1 && threads <= 1024 && block.x <= 1024 && block.y <= 1024 && block.z <= 64;
  const bool grid_ok =
      grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu && grid.y <= 65535 && grid.z <= 65535;
  return block_ok && grid_ok;
}

// ---- cross-block write check ----
// Blocks run one after another here, so a non-atomic `+=` of two blocks on one element never
// loses an update, whatever the order; on a GPU it does. With the check on, a launch keeps a copy
// of each device allocation its kernel may write (the ones its non-const pointer arguments point
// into) and, after each block, compares: a byte the block changed that an earlier block of the
// launch had changed too is a race, unless an atomic touched it. Costs one pass over those
// allocations per block, so it is for tests (BP_SIM_CHECK_WRITES=1), not on by default. Host
// memory passed straight to a kernel (not from cudaMalloc) is not watched; writes by two threads
// of one block are the schedules' business.
struct WatchedAllocation {
  unsigned char* base = nullptr;
  size_t bytes = 0;
  std::vector<unsigned char> seen;  // the contents after the last block
  std::vector<uint32_t> writer;     // 1 + linear index of the block that last changed each byte; 0: none
};
struct WriteCheck {
  std::vector<WatchedAllocation> watched;
  std::unordered_set<uintptr_t> atomic_bytes;
};
thread_local WriteCheck* g_write_check = nullptr;
std::optional<bool> g_check_writes;  // under g_schedule_mu; empty until read from BP_SIM_CHECK_WRITES

void watch_outputs(WriteCheck& check, const std::vector<void*>& outputs) {
  std::lock_guard<std::mutex> g(g_mu);
  for (void* p : outputs) {
    auto it = g_allocations.upper_bound(p);
    if (!p || it == g_allocations.begin()) continue;
    --it;
    auto* base = static_cast<unsigned char*>(it->first);
    if (static_cast<unsigned char*>(p) >= base + it->second) continue;  // not device memory
    bool known = false;
    for (const auto& w : check.watched) known |= w.base == base;
    if (known) continue;
    WatchedAllocation w;
    w.base = base;
    w.bytes = it->second;
    w.seen.assign(base, base + w.bytes);
    w.writer.assign(w.bytes, 0);
    check.watched.push_back(std::move(w));
  }
}

std::string block_name(uint64_t linear, dim3 grid) {
  return "(" + std::to_string(linear % grid.x) + "," + std::to_string(linear / grid.x % grid.y) + "," +
         std::to_string(linear / (uint64_t{grid.x} * grid.y)) + ")";
}

// After block `linear` ran: records what it changed, throws on a byte an earlier block changed.
void check_block_writes(WriteCheck& check, uint64_t linear, dim3 grid) {
  constexpr size_t kChunk = 4096;  // unchanged chunks are skipped by one memcmp
  for (auto& w : check.watched)
    for (size_t c0 = 0; c0 < w.bytes; c0 += kChunk) {
      const size_t c1 = std::min(w.bytes, c0 + kChunk);
      if (std::memcmp(w.base + c0, w.seen.data() + c0, c1 - c0) == 0) continue;
      for (size_t i = c0; i < c1; ++i) {
        if (w.base[i] == w.seen[i]) continue;
        w.seen[i] = w.base[i];
        const uint32_t before = w.writer[i];
        w.writer[i] = static_cast<uint32_t>(linear + 1);
        if (before == 0 || check.atomic_bytes.count(reinterpret_cast<uintptr_t>(w.base + i))) continue;
        throw std::runtime_error("[cuda-sim] blocks " + block_name(before - 1, grid) + " and " +
                                 block_name(linear, grid) + " of one launch both changed byte " + std::to_string(i) +
                                 " of a " + std::to_string(w.bytes) +
                                 "-byte device allocation without an atomic: on a GPU the blocks run at once, so "
                                 "which value stays (or, for a +=, whether an update is lost) is a race");
      }
    }
}

}  // namespace

bool write_check_enabled() {
  std::lock_guard<std::mutex> g(g_schedule_mu);
  if (!g_check_writes) {
    const char* env = std::getenv("BP_SIM_CHECK_WRITES");
    g_check_writes = env && std::string(env) == "1";
  }
  return *g_check_writes;
}
bool set_write_check(bool on) {
  const bool before = write_check_enabled();
  std::lock_guard<std::mutex> g(g_schedule_mu);
  g_check_writes = on;
  return before;
}
void sim_note_atomic(const void* p, size_t bytes) {
  if (!g_write_check) return;
  for (size_t i = 0; i < bytes; ++i) g_write_check->atomic_bytes.insert(reinterpret_cast<uintptr_t>(p) + i);
}

void launch_grid(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body,
                 const void* kernel, const std::vector<void*>& outputs) {
  g_launches.fetch_add(1);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (!launch_configuration_ok(grid, block)) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  if (dynamic_shared_bytes > dynamic_shared_limit(kernel)) {
    fail(cudaErrorInvalidValue);
    return;
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_injected != cudaSuccess) {
      g_last_error = g_injected;
      g_injected = cudaSuccess;
      return;
    }
  }
  if (g_block) throw std::logic_error("[cuda-sim] a kernel launched another kernel (dynamic parallelism)");
  const auto [schedule, launch_seed] = next_launch_schedule();
  BlockRun run;
  run.body = &body;
  run.order = schedule.order;
  run.rng.seed(launch_seed);
  run.warp_slots.assign((threads + warpSize - 1) / warpSize * warpSize, 0);
  run.dynamic_shared.assign(dynamic_shared_bytes, 0);
  gridDim = grid;
  blockDim = block;
  WriteCheck write_check;
  if (!outputs.empty()) watch_outputs(write_check, outputs);
  g_write_check = write_check.watched.empty() ? nullptr : &write_check;
  g_block = &run;
  try {
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    const BlockOrder order = block_order(schedule.order, blocks, run.rng);
    for (uint64_t k = 0; k < blocks; ++k) {
      const uint64_t b = order.at(k);
      blockIdx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                      static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y)));
      run_block(run);
      if (g_write_check) check_block_writes(*g_write_check, b, grid);
    }
  } catch (...) {
    g_block = nullptr;
    g_write_check = nullptr;
    throw;
  }
  g_block = nullptr;
  g_write_check = nullptr;
}

// ---- runtime ----
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (bytes > g_budget - std::min(g_budget, g_in_use)) {
      g_last_error = cudaErrorMemoryAllocation;
      return cudaErrorMemoryAllocation;
    }
  }
  void* p = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{256});
  std::lock_guard<std::mutex> g(g_mu);
  g_allocations[p] = bytes;
  g_in_use += bytes;
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_allocations.find(ptr);
  if (it == g_allocations.end()) {
    g_last_error = cudaErrorInvalidValue;
    return cudaErrorInvalidValue;
  }
  g_in_use -= it->second;
  g_allocations.erase(it);
  ::operator delete (ptr, std::align_val_t{256});
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes) std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(ptr, value, bytes);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  if (total_bytes) *total_bytes = g_budget;
  if (free_bytes) *free_bytes = g_budget - std::min(g_budget, g_in_use);
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> g(g_mu);
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_last_error;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (s) *s = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaPeekAtLastError();
}
cudaError_t cudaDeviceSynchronize() {
  return cudaPeekAtLastError();
}
cudaError_t cudaSetDevice(int index) {
  return index == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (!value || device != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(g_mu);
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor: *value = g_cc_major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = g_cc_minor; return cudaSuccess;
  }
  g_last_error = cudaErrorInvalidValue;
  return cudaErrorInvalidValue;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  }
  return "unknown error";
}

void set_memory_budget(size_t bytes_total) {
  std::lock_guard<std::mutex> g(g_mu);
  g_budget = bytes_total;
}
size_t memory_in_use() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_in_use;
}
bool memory_range_live(const void* ptr, size_t bytes) {
  const auto* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_allocations.upper_bound(const_cast<void*>(ptr));  // the first allocation starting after ptr
  if (!p || it == g_allocations.begin()) return false;
  --it;
  const auto* base = static_cast<const char*>(it->first);
  return p >= base && bytes <= it->second && static_cast<size_t>(p - base) <= it->second - bytes;
}
void set_compute_capability(int major, int minor) {
  std::lock_guard<std::mutex> g(g_mu);
  g_cc_major = major;
  g_cc_minor = minor;
}
void inject_launch_error(cudaError_t e) {
  std::lock_guard<std::mutex> g(g_mu);
  g_injected = e;
}
uint64_t launch_count() {
  return g_launches.load();
}

ScheduleChoice parse_schedule(const char* text) {
  const std::string s = text ? text : "";
  if (s.empty() || s == "forward") return {Schedule::Forward, 0};
  if (s == "reverse") return {Schedule::Reverse, 0};
  if (s == "shuffle") return {Schedule::Shuffle, 1};
  if (s.rfind("shuffle:", 0) == 0 && s.size() > 8 && s.find_first_not_of("0123456789", 8) == std::string::npos)
    return {Schedule::Shuffle, std::stoull(s.substr(8))};
  throw std::invalid_argument("[cuda-sim] BP_SIM_SCHEDULE='" + s +
                              "' is not forward, reverse, shuffle or shuffle:SEED (a decimal number)");
}
ScheduleChoice current_schedule() {
  std::lock_guard<std::mutex> g(g_schedule_mu);
  if (!g_schedule) g_schedule = parse_schedule(std::getenv("BP_SIM_SCHEDULE"));
  return *g_schedule;
}
ScheduleChoice set_schedule(ScheduleChoice choice) {
  const ScheduleChoice before = current_schedule();
  std::lock_guard<std::mutex> g(g_schedule_mu);
  g_schedule = choice;
  g_schedule_launches = 0;
  return before;
}

}  // namespace bp::sim
