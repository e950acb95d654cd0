// CUDA caching allocator (built only with the CUDA backend).
//
// Freed blocks are kept in a size-keyed cache and reused for requests of the same rounded size;
// when cudaMalloc fails (or the limit would be passed) the cache is emptied and the request
// retried once before OutOfMemoryError is thrown. The limit defaults to the card's free memory
// at first use. Linked against cudart only (no -lcuda): cudart loads the driver at run time.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "backend/cuda/cuda_device.h"
#include "core/allocator.h"
#include "core/error.h"

namespace bp {

namespace {

size_t round_size(size_t bytes) {
  return (bytes + 511) / 512 * 512;
}

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {
    if (cudaSetDevice(index_) != cudaSuccess)
      throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE, fmt::format("[cuda] cannot select device {}", index_));
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    set_total(total_b);
    set_limit(free_b);
  }
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t r = round_size(bytes);
    reserve(bytes);  // throws past the limit
    {
      std::lock_guard<std::mutex> g(cache_mu_);
      auto it = cache_.find(r);
      if (it != cache_.end()) {
        void* p = it->second;
        cached_bytes_ -= r;
        cache_.erase(it);
        set_cached(cached_bytes_);
        return p;
      }
    }
    void* p = nullptr;
    cudaSetDevice(index_);
    if (cudaMalloc(&p, r) != cudaSuccess) {
      cudaGetLastError();
      empty_cache();
      if (cudaMalloc(&p, r) != cudaSuccess) {
        cudaGetLastError();
        release(bytes);
        auto s = stats();
        throw OutOfMemoryError(device().name(), bytes, s.bytes_in_use, s.bytes_cached, s.bytes_limit, s.bytes_total);
      }
    }
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    if (!ptr) return;
    size_t r = round_size(bytes);
    std::lock_guard<std::mutex> g(cache_mu_);
    cache_.emplace(r, ptr);
    cached_bytes_ += r;
    set_cached(cached_bytes_);
    release(bytes);
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> g(cache_mu_);
    for (auto& [size, p] : cache_) cudaFree(p);
    cache_.clear();
    cached_bytes_ = 0;
    set_cached(0);
  }
  Device device() const override { return Device{DeviceType::CUDA, index_}; }

 private:
  int index_;
  std::mutex cache_mu_;
  std::multimap<size_t, void*> cache_;
  size_t cached_bytes_ = 0;
};

}  // namespace

CudaStatus cuda_status() {
  CudaStatus s;
  s.compiled = true;
  cudaRuntimeGetVersion(&s.runtime_version);
  cudaDriverGetVersion(&s.driver_version);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    s.why_unavailable = fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
    cudaGetLastError();
    return s;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.bytes_total = p.totalGlobalMem;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    cudaSetDevice(i);
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess) d.bytes_free = f;
    s.devices.push_back(d);
  }
  if (s.devices.empty()) s.why_unavailable = "the CUDA runtime reports no devices";
  return s;
}

Allocator* cuda_allocator(int index) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CudaAllocator>> allocators;
  std::lock_guard<std::mutex> g(mu);
  auto& a = allocators[index];
  if (!a) a = std::make_unique<CudaAllocator>(index);
  return a.get();
}

}  // namespace bp

namespace bp {
void cuda_op_unavailable(const char* op) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              fmt::format("[{}] this op has no CUDA kernel yet; train on the CPU (--device cpu)", op));
}
}  // namespace bp
