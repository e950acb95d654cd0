// The simulation's race checks as the scheduler (cuda_sim.cpp) uses them; implemented in
// sim_races.cpp, which explains what each check finds and what it cannot. Internal to the
// simulation: tests use the controls in cuda_sim.h (set_schedule, set_write_check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/cuda/sim/cuda_sim.h"

namespace bp::sim::races {

// The schedule of the launch starting now, and the seed of its permutations: the seed chosen
// and the number of launches since the schedule was set (not the tests that ran before), so
// set_schedule followed by the same launches gives the same orders.
struct LaunchSchedule {
  Schedule order;
  uint64_t seed;
};
LaunchSchedule next_launch_schedule();

// Block k of a launch in the schedule's order, as a linear index x + gx·(y + gy·z).
class BlockOrder {
 public:
  BlockOrder(Schedule order, uint64_t blocks, std::mt19937_64& rng);
  uint64_t at(uint64_t k) const;

 private:
  Schedule order_;
  uint64_t blocks_;
  std::vector<uint64_t> permutation_;  // Shuffle only
};

// The device allocation holding p ({nullptr, 0}: none). Implemented by the runtime (cuda_sim.cpp).
std::pair<unsigned char*, size_t> allocation_containing(const void* p);

// The cross-block write check of one launch: watches the allocations `outputs` point into while
// it lives (atomics report to it through sim_note_atomic on this OS thread).
class WriteCheck {
 public:
  explicit WriteCheck(const std::vector<void*>& outputs);
  ~WriteCheck();
  WriteCheck(const WriteCheck&) = delete;
  WriteCheck& operator=(const WriteCheck&) = delete;
  // After block `linear` of `grid` ran: records the bytes it changed; throws std::runtime_error
  // on one that an earlier block of the launch changed too, unless an atomic touched it.
  void after_block(uint64_t linear, dim3 grid);
  void note_atomic(const void* p, size_t bytes);

 private:
  struct Watched {
    unsigned char* base = nullptr;
    size_t bytes = 0;
    std::vector<unsigned char> seen;  // the contents after the last block
    std::vector<uint32_t> writer;     // 1 + linear index of the block that last changed each byte; 0: none
  };
  std::vector<Watched> watched_;
  std::unordered_set<uintptr_t> atomic_bytes_;
};

}  // namespace bp::sim::races
