// Tensor: shape (rank <= 4), dtype, device and storage from that device's allocator
// (DESIGN.md "Tensor"). Always row-major and contiguous. Views share storage: `rows(a, b)`
// slices the first dimension, `reshape` reinterprets the shape. Copies are explicit (clone, to).
//
// Host access: data<T>() and raw() are for host code and work on CPU tensors only; on a CUDA
// tensor they throw RUNTIME_INTERNAL instead of handing out a pointer the host must not read
// (on the simulated device of the tests, device memory IS host memory, so only this guard makes a
// stray host read fail there as it would crash on a real GPU). The kernels of a tensor's own
// device get its pointer through kernel_data<T>() / kernel_raw() (ops/ only). Copies, fill,
// zero and to_vector go through the device's explicit copies (core/allocator.h device_copy).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace bp {

struct Shape {
  std::array<int64_t, 4> dims{0, 0, 0, 0};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  explicit Shape(const std::vector<int64_t>& d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i < 0 ? i + rank : i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[512, 576]"
  std::vector<int64_t> vec() const { return {dims.begin(), dims.begin() + rank}; }
};

// Memory owned by an allocator (or borrowed: allocator == nullptr, with a keep-alive handle).
class Storage {
 public:
  Storage(Allocator* allocator, size_t bytes);
  Storage(void* external, size_t bytes, std::shared_ptr<void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Allocator* allocator() const { return allocator_; }

 private:
  Allocator* allocator_;
  void* data_;
  size_t bytes_;
  std::shared_ptr<void> keep_alive_;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised memory from the device's allocator (throws OutOfMemoryError past its limit).
  static Tensor empty(Shape shape, DType dtype = DType::F32, Device device = {});
  static Tensor zeros(Shape shape, DType dtype = DType::F32, Device device = {});
  static Tensor from_vector(const std::vector<float>& v, Shape shape);
  static Tensor from_vector(const std::vector<int32_t>& v, Shape shape);
  // Wraps memory owned elsewhere (an mmap'd file); not counted by any allocator.
  static Tensor borrow(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive);

  bool defined() const { return storage_ != nullptr || shape_.rank > 0; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return dtype_bytes(dtype_, numel()); }

  // Host pointers (CPU tensors only; a CUDA tensor throws RUNTIME_INTERNAL, see the file comment).
  void* raw() { return const_cast<void*>(static_cast<const Tensor*>(this)->raw()); }
  const void* raw() const {
    if (device_.type != DeviceType::CPU) host_access_error();
    return kernel_raw();
  }
  // Typed host access; checks the dtype matches T (float = f32, int32_t = i32, uint16_t = bf16/f16).
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  // Pointers into the tensor's own device memory, for that device's kernels (ops/ dispatch only).
  void* kernel_raw() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  template <class T>
  T* kernel_data() const;
  // Names this tensor's memory for as long as it lives: expires when the storage is freed, so a
  // cache of facts about contents that are never written (a frozen weight's range:
  // ops/held_range.cpp) cannot mistake a new tensor at a reused address for an old one.
  std::weak_ptr<const void> storage_token() const { return storage_; }

  // Views (share storage).
  Tensor rows(int64_t begin, int64_t end) const;  // slice of the first dimension
  // The view of `parts` as one tensor, rows after rows, when they are consecutive row ranges of one
  // storage in that order (as rows() of one tensor gives them) with the same dtype, device and
  // trailing dimensions; undefined otherwise (nothing is copied).
  static Tensor joined_rows(std::span<const Tensor* const> parts);
  Tensor reshape(Shape shape) const;
  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;     // a copy on `device` (same dtype)
  void copy_from(const Tensor& src);  // same shape; converts dtype
  void fill(float value);             // float types only
  void zero();
  std::vector<float> to_vector() const;  // converts to f32
  std::string describe() const;          // "f32[512, 576] on CPU"

 private:
  [[noreturn]] void host_access_error() const;
  template <class T>
  void check_element_type() const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
};

template <class T>
inline constexpr bool kAlwaysFalse = false;

template <class T>
T* Tensor::data() {
  return const_cast<T*>(static_cast<const Tensor*>(this)->data<T>());
}

template <class T>
const T* Tensor::data() const {
  check_element_type<T>();
  return static_cast<const T*>(raw());
}

template <class T>
T* Tensor::kernel_data() const {
  check_element_type<T>();
  return static_cast<T*>(kernel_raw());
}

template <class T>
void Tensor::check_element_type() const {
  if constexpr (std::is_same_v<T, float>) {
    BP_CHECK(dtype_ == DType::F32, "[tensor] data<float>() on a {} tensor", dtype_name(dtype_));
  } else if constexpr (std::is_same_v<T, int32_t>) {
    BP_CHECK(dtype_ == DType::I32, "[tensor] data<int32_t>() on a {} tensor", dtype_name(dtype_));
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    BP_CHECK(dtype_ == DType::BF16 || dtype_ == DType::F16, "[tensor] data<uint16_t>() on a {} tensor",
             dtype_name(dtype_));
  } else {
    static_assert(kAlwaysFalse<T>, "unsupported element type");
  }
}

}  // namespace bp
