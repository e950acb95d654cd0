// The bookkeeping of the CUDA caching allocator (caching_allocator.h): which parts of the device
// memory it holds are handed out and which are free, and which free block a request gets. No device
// call here: the allocator asks the device for segments and gives wholly free ones back.
//
// Why: with packed batches the token count changes from micro-batch to micro-batch, so activation
// sizes do too; a cache that reuses only blocks of exactly the requested size calls cudaMalloc
// (slow, and synchronising on a real card) every step and grows until an OOM empties it. This
// follows the behaviour PyTorch documents for its CUDA caching allocator:
//   - sizes are rounded up to 512 bytes; requests of up to 1 MiB come from the small pool, the rest
//     from the large pool, so small tensors do not fragment the large blocks;
//   - a segment (one cudaMalloc) is 2 MiB for the small pool, 20 MiB for requests under 10 MiB, and
//     the request rounded up to 2 MiB beyond (segment_size);
//   - a request gets the smallest free block of its pool that holds it (best fit; ties: lowest
//     address), split when the rest is worth keeping (small pool: 512 bytes or more; large pool:
//     more than 1 MiB), the rest staying free;
//   - a freed block merges with its free neighbours in the same segment (coalescing), so a segment
//     whose blocks are all free is one block again and can be returned to the device;
//   - blocks of max_split_bytes or more are never split and serve only requests of at least that
//     size that are at most 20 MiB smaller than the block (the cap on how much larger a reused
//     block may be); default: no limit, as in PyTorch (every large block may be split).
// Not thread-safe: the allocator holds its lock around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bp {

class DeviceBlockPool {
 public:
  static constexpr size_t kMiB = size_t{1} << 20;
  static constexpr size_t kMinBlock = 512;            // rounding of every request
  static constexpr size_t kSmallRequest = 1 * kMiB;   // up to this: the small pool
  static constexpr size_t kSmallSegment = 2 * kMiB;   // the small pool's segments
  static constexpr size_t kLargeSegment = 20 * kMiB;  // segments for large requests under kMinLargeAlloc
  static constexpr size_t kMinLargeAlloc = 10 * kMiB;
  static constexpr size_t kRoundLarge = 2 * kMiB;      // segments for larger requests are multiples of this
  static constexpr size_t kOversizeSlack = 20 * kMiB;  // an unsplittable block serves requests this close

  static size_t round_size(size_t bytes) { return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock; }
  static bool small_request(size_t rounded) { return rounded <= kSmallRequest; }
  // What cudaMalloc is asked for when no free block holds a request of `rounded` bytes.
  static size_t segment_size(size_t rounded) {
    if (small_request(rounded)) return kSmallSegment;
    if (rounded < kMinLargeAlloc) return kLargeSegment;
    return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  }

  explicit DeviceBlockPool(size_t max_split_bytes = SIZE_MAX) : max_split_bytes_(max_split_bytes) {}
  ~DeviceBlockPool() {  // the Block records only: the device memory is the allocator's business
    std::set<Block*> firsts;
    auto note = [&](Block* b) {
      while (b->prev) b = b->prev;
      firsts.insert(b);
    };
    for (Block* b : small_free_) note(b);
    for (Block* b : large_free_) note(b);
    for (auto& [ptr, b] : live_) note(b);
    for (Block* b : firsts)
      while (b) {
        Block* next = b->next;
        delete b;
        b = next;
      }
  }
  DeviceBlockPool(const DeviceBlockPool&) = delete;
  DeviceBlockPool& operator=(const DeviceBlockPool&) = delete;

  // A free block for a request of `rounded` bytes (a multiple of kMinBlock), now handed out; nullptr
  // when none of its pool fits.
  void* take(size_t rounded) {
    std::set<Block*, BySize>& pool = small_request(rounded) ? small_free_ : large_free_;
    Block probe{nullptr, rounded};
    auto it = pool.lower_bound(&probe);
    if (it == pool.end() || !reusable(**it, rounded)) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return hand_out(b, rounded);
  }
  // A new segment of `segment_bytes` at `ptr` (from cudaMalloc) holding a request of `rounded` bytes;
  // returns the handed-out block (ptr itself).
  void* add_segment(void* ptr, size_t segment_bytes, size_t rounded) {
    reserved_bytes_ += segment_bytes;
    ++segments_;
    return hand_out(new Block{static_cast<char*>(ptr), segment_bytes, small_request(rounded)}, rounded);
  }
  // Gives back a block handed out before, merged with its free neighbours. False: not one of ours.
  bool give_back(void* ptr) {
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    Block* b = it->second;
    live_.erase(it);
    handed_out_bytes_ -= b->size;
    b->free = true;
    if (b->prev && b->prev->free) b = merge(b->prev, b);
    if (b->next && b->next->free) b = merge(b, b->next);
    pool_of(*b).insert(b);
    return true;
  }
  // Removes every segment whose memory is all free; returns them (pointer, bytes) for cudaFree.
  std::vector<std::pair<void*, size_t>> take_free_segments() {
    std::vector<std::pair<void*, size_t>> segments;
    for (auto* pool : {&small_free_, &large_free_})
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {
          ++it;
          continue;
        }
        segments.emplace_back(b->ptr, b->size);
        reserved_bytes_ -= b->size;
        --segments_;
        it = pool->erase(it);
        delete b;
      }
    return segments;
  }

  size_t reserved_bytes() const { return reserved_bytes_; }                  // all segments
  size_t free_bytes() const { return reserved_bytes_ - handed_out_bytes_; }  // cached, reusable
  size_t handed_out_bytes() const { return handed_out_bytes_; }              // rounded, with unsplit rests
  size_t segments() const { return segments_; }
  // The size of the block handed out at ptr (0: none).
  size_t block_bytes(const void* ptr) const {
    auto it = live_.find(const_cast<void*>(ptr));
    return it == live_.end() ? 0 : it->second->size;
  }

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small = false;
    bool free = false;
    Block* prev = nullptr;  // neighbours in the same segment (nullptr at its ends)
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };

  std::set<Block*, BySize>& pool_of(const Block& b) { return b.small ? small_free_ : large_free_; }

  bool reusable(const Block& b, size_t rounded) const {
    if (b.small || b.size < max_split_bytes_) return true;
    return rounded >= max_split_bytes_ && b.size - rounded < kOversizeSlack;  // oversize: not split
  }

  void* hand_out(Block* b, size_t rounded) {
    const size_t rest = b->size - rounded;
    const bool split = b->small ? rest >= kMinBlock : rounded < max_split_bytes_ && rest > kSmallRequest;
    if (split) {
      auto* r = new Block{b->ptr + rounded, rest, b->small, true, b, b->next};
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = rounded;
      pool_of(*r).insert(r);
    }
    b->free = false;
    live_.emplace(b->ptr, b);
    handed_out_bytes_ += b->size;
    return b->ptr;
  }

  // Joins neighbours a and b (b follows a in their segment), both free; the one being given back is
  // in no set yet (erasing it is a no-op).
  Block* merge(Block* a, Block* b) {
    for (Block* x : {a, b})
      if (x->free) pool_of(*x).erase(x);
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    delete b;
    return a;
  }

  size_t max_split_bytes_;
  std::set<Block*, BySize> small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;
  size_t reserved_bytes_ = 0, handed_out_bytes_ = 0, segments_ = 0;
};

}  // namespace bp
