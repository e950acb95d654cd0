// The CUDA simulation's scheduler and runtime (see cuda_sim.h for what is modelled and why).
//
// Scheduler: one block at a time. Each thread of the block is a fiber with its own stack. The
// scheduler resumes every fiber that is ready, in thread order, until it finishes or stops at a
// meeting point (a block barrier or a warp meeting); then it releases whole warps whose live lanes
// all wait at a warp meeting, or else the whole block when all live threads wait at __syncthreads.
// Anything else (some threads at a barrier that others exited without reaching, or a warp waiting
// for lanes stuck at a block barrier) is a deadlock on a GPU and an error here.
//
// The order of one round and of the blocks is the launch's schedule, and a launch may carry the
// cross-block write check: both are race checks, explained in sim_races.cpp.
//
// Fiber switch: on x86-64 a dozen instructions (bp_sim_switch_stack below: callee-saved
// registers, MXCSR and the x87 control word); glibc's swapcontext makes a sigprocmask system call
// per switch, which made a 1,000-block reduction take seconds. Elsewhere, under AddressSanitizer
// (which follows swapcontext but not a hand-made switch), or with -DBP_SIM_UCONTEXT: ucontext.
#include "backend/cuda/sim/cuda_sim.h"

#include <sys/mman.h>
#include <ucontext.h>

#include "backend/cuda/sim/sim_races.h"
#include "core/sanitizers.h"

#if defined(__x86_64__) && !BP_ASAN && !defined(BP_SIM_UCONTEXT)
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
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace bp::sim {

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

constexpr size_t kFiberStackBytes = 256 * 1024;
// Where dynamic shared memory starts: 128-byte aligned, as on a GPU (wmma's 32-byte aligned tiles
// and vector loads rely on it).
constexpr uintptr_t kDynamicSharedAlign = 128;

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
  // Shuffle, a warp-serial block: warps in this order, each resumed alone until none of its lanes
  // is ready (all wait at __syncthreads or have ended). Empty: rounds over every warp.
  std::vector<int> warp_order;
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
  for (int w : run.warp_order) {  // warp-serial: the first warp in the order with a ready lane
    for (int i = w * warpSize; i < std::min(n, (w + 1) * warpSize); ++i)
      if (run.fibers[i].state == FiberState::Ready) run.round.push_back(i);
    if (!run.round.empty()) break;
  }
  if (!run.warp_order.empty()) {
    std::shuffle(run.round.begin(), run.round.end(), run.rng);
    return;
  }
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
  run.warp_order.clear();
  if (run.order == Schedule::Shuffle && (run.rng() & 1u)) {  // half the blocks run warp-serial
    run.warp_order.resize((n + warpSize - 1) / warpSize);
    std::iota(run.warp_order.begin(), run.warp_order.end(), 0);
    std::shuffle(run.warp_order.begin(), run.warp_order.end(), run.rng);
  }
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

// ---- runtime state ----
std::mutex g_mu;
std::map<void*, size_t> g_allocations;
size_t g_budget = size_t{16} << 30;
size_t g_in_use = 0;
int g_cc_major = 8, g_cc_minor = 0;
cudaError_t g_last_error = cudaSuccess;
cudaError_t g_injected = cudaSuccess;
std::atomic<uint64_t> g_launches{0};
std::atomic<uint64_t> g_d2h{0}, g_sync_reads{0}, g_h2d{0}, g_syncs{0};
std::atomic<uint64_t> g_malloc_calls_at_reset{0};  // cuda_malloc_calls() at the last reset_runtime_counts()
std::atomic<uint64_t> g_launches_at_reset{0};      // g_launches at the last reset_runtime_counts()
std::atomic<uint64_t> g_gemms{0};
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
  if (!g_block) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(g_block->dynamic_shared.data());
  return reinterpret_cast<void*>((base + kDynamicSharedAlign - 1) / kDynamicSharedAlign * kDynamicSharedAlign);
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

}  // namespace

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
  const races::LaunchSchedule schedule = races::next_launch_schedule();
  BlockRun run;
  run.body = &body;
  run.order = schedule.order;
  run.rng.seed(schedule.seed);
  run.warp_slots.assign((threads + warpSize - 1) / warpSize * warpSize, 0);
  run.dynamic_shared.assign(dynamic_shared_bytes + kDynamicSharedAlign, 0);  // room to align the start
  gridDim = grid;
  blockDim = block;
  races::WriteCheck write_check(outputs);  // watches nothing when outputs is empty
  g_block = &run;
  try {
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    const races::BlockOrder order(schedule.order, blocks, run.rng);
    for (uint64_t k = 0; k < blocks; ++k) {
      const uint64_t b = order.at(k);
      blockIdx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                      static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y)));
      run_block(run);
      write_check.after_block(b, grid);
    }
  } catch (...) {
    g_block = nullptr;
    throw;
  }
  g_block = nullptr;
}

// ---- runtime ----
std::map<void*, size_t> g_blocks;  // note_allocator_block: the caching allocator's blocks in use

// The entry of `ranges` (start -> bytes) holding p, or {nullptr, 0}. Under g_mu.
std::pair<unsigned char*, size_t> range_containing(const std::map<void*, size_t>& ranges, const void* p) {
  auto it = ranges.upper_bound(const_cast<void*>(p));
  if (!p || it == ranges.begin()) return {nullptr, 0};
  --it;
  auto* base = static_cast<unsigned char*>(it->first);
  if (static_cast<const unsigned char*>(p) >= base + it->second) return {nullptr, 0};
  return {base, it->second};
}
// A block of the caching allocator holding p, else the cudaMalloc allocation: the write check then
// watches one tensor's bytes, not a whole segment of the allocator's.
std::pair<unsigned char*, size_t> races::allocation_containing(const void* p) {
  std::lock_guard<std::mutex> g(g_mu);
  if (auto block = range_containing(g_blocks, p); block.first) return block;
  return range_containing(g_allocations, p);
}
void note_allocator_block(void* ptr, size_t bytes, bool in_use) {
  std::lock_guard<std::mutex> g(g_mu);
  if (in_use)
    g_blocks[ptr] = bytes;
  else
    g_blocks.erase(ptr);
}
std::atomic<uint64_t> g_malloc_calls{0};  // cuda_malloc_calls(): successful cudaMallocs
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
  g_malloc_calls.fetch_add(1);
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
namespace {
cudaError_t copy_counted(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToHost) g_d2h.fetch_add(1);
  if (kind == cudaMemcpyHostToDevice) g_h2d.fetch_add(1);
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToHost) g_sync_reads.fetch_add(1);
  return copy_counted(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return copy_counted(dst, src, bytes, kind);
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
  g_syncs.fetch_add(1);
  return cudaPeekAtLastError();
}
cudaError_t cudaDeviceSynchronize() {
  g_syncs.fetch_add(1);
  return cudaPeekAtLastError();
}
cudaError_t cudaSetDevice(int index) {
  return index == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaGetDevice(int* index) {
  if (!index) return fail(cudaErrorInvalidValue);
  *index = 0;
  return cudaSuccess;
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
uint64_t cuda_malloc_calls() {
  return g_malloc_calls.load();
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
RuntimeCounts runtime_counts() {
  RuntimeCounts c;
  c.device_to_host_copies = g_d2h.load();
  c.synchronous_reads = g_sync_reads.load();
  c.host_to_device_copies = g_h2d.load();
  c.synchronizations = g_syncs.load();
  c.mallocs = cuda_malloc_calls() - g_malloc_calls_at_reset.load();
  c.kernel_launches = g_launches.load() - g_launches_at_reset.load();
  c.gemms = g_gemms.load();
  return c;
}
void count_gemm_call() {
  g_gemms.fetch_add(1);
}
void reset_runtime_counts() {
  g_d2h = 0;
  g_sync_reads = 0;
  g_h2d = 0;
  g_syncs = 0;
  g_malloc_calls_at_reset = cuda_malloc_calls();
  g_launches_at_reset = g_launches.load();
  g_gemms = 0;
}

}  // namespace bp::sim
