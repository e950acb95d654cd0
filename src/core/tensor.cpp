#include "core/tensor.h"

#include <algorithm>
#include <cstring>

namespace bp {

namespace {

bool on_host(const Tensor& t) {
  return t.device().type == DeviceType::CPU;
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> d) {
  BP_CHECK(d.size() <= 4, "[tensor] rank {} > 4", d.size());
  rank = static_cast<int>(d.size());
  std::copy(d.begin(), d.end(), dims.begin());
}

Shape::Shape(const std::vector<int64_t>& d) {
  BP_CHECK(d.size() <= 4, "[tensor] rank {} > 4", d.size());
  rank = static_cast<int>(d.size());
  std::copy(d.begin(), d.end(), dims.begin());
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[static_cast<size_t>(i)]);
  return s + "]";
}

Storage::Storage(Allocator* allocator, size_t bytes)
    : allocator_(allocator), data_(allocator->allocate(bytes)), bytes_(bytes) {}

Storage::Storage(void* external, size_t bytes, std::shared_ptr<void> keep_alive)
    : allocator_(nullptr), data_(external), bytes_(bytes), keep_alive_(std::move(keep_alive)) {}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, bytes_);
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int i = 0; i < shape.rank; ++i) BP_CHECK(shape[i] >= 0, "[tensor] negative dimension in {}", shape.str());
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(&allocator_for(device), t.nbytes());
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, Shape shape) {
  BP_CHECK(static_cast<int64_t>(v.size()) == shape.numel(), "[tensor] {} values for shape {}", v.size(), shape.str());
  Tensor t = empty(shape, DType::F32);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::from_vector(const std::vector<int32_t>& v, Shape shape) {
  BP_CHECK(static_cast<int64_t>(v.size()) == shape.numel(), "[tensor] {} values for shape {}", v.size(), shape.str());
  Tensor t = empty(shape, DType::I32);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), std::move(keep_alive));
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  BP_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= dim(0), "[tensor] rows({}, {}) of {}", begin, end,
           shape_.str());
  Tensor t = *this;
  int64_t row_elems = dim(0) ? numel() / dim(0) : 0;
  t.offset_ = offset_ + dtype_bytes(dtype_, begin * row_elems);
  t.shape_.dims[0] = end - begin;
  return t;
}

Tensor Tensor::joined_rows(std::span<const Tensor* const> parts) {
  if (parts.empty() || !parts[0]) return Tensor();
  const Tensor& first = *parts[0];
  if (!first.storage_ || first.rank() < 1) return Tensor();
  Tensor joined = first;
  size_t next = first.offset_ + first.nbytes();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (!parts[i]) return Tensor();
    const Tensor& t = *parts[i];
    if (t.storage_ != first.storage_ || t.dtype_ != first.dtype_ || t.rank() != first.rank() || t.offset_ != next)
      return Tensor();
    for (int d = 1; d < first.rank(); ++d)
      if (t.dim(d) != first.dim(d)) return Tensor();
    joined.shape_.dims[0] += t.dim(0);
    next += t.nbytes();
  }
  return joined;
}

Tensor Tensor::reshape(Shape shape) const {
  BP_CHECK(shape.numel() == numel(), "[tensor] reshape {} to {}", shape_.str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::host_access_error() const {
  throw Error(ErrorCode::RUNTIME_INTERNAL,
              fmt::format("[tensor] host code read the memory of {} directly; device memory is reached only by "
                          "that device's kernels or an explicit copy (Tensor::to(Device), to_vector, copy_from)",
                          describe()));
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  device_copy(device_.type, t.kernel_raw(), kernel_raw(), nbytes(), CopyKind::DeviceToDevice);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return clone();
  BP_CHECK(on_host(*this) || device.type == DeviceType::CPU, "[tensor] copy from {} to {}: go through the CPU",
           device_.name(), device.name());
  Tensor t = empty(shape_, dtype_, device);
  const bool upload = on_host(*this);
  device_copy(upload ? device.type : device_.type, t.kernel_raw(), kernel_raw(), nbytes(),
              upload ? CopyKind::HostToDevice : CopyKind::DeviceToHost);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  if (!on_host(*this)) return to(Device{}).to(dtype).to(device_);  // converted on the host
  Tensor t = empty(shape_, dtype, device_);
  convert(raw(), dtype_, t.raw(), dtype, static_cast<size_t>(numel()));
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  BP_CHECK(src.shape() == shape_, "[tensor] copy_from {} into {}", src.shape().str(), shape_.str());
  if (on_host(*this) && on_host(src)) {
    convert(src.raw(), src.dtype(), raw(), dtype_, static_cast<size_t>(numel()));
    return;
  }
  const Tensor staged = src.dtype() == dtype_ ? src : src.to(dtype_);  // converted where it lives
  if (on_host(staged))
    device_copy(device_.type, kernel_raw(), staged.kernel_raw(), nbytes(), CopyKind::HostToDevice);
  else if (on_host(*this))
    device_copy(staged.device().type, kernel_raw(), staged.kernel_raw(), nbytes(), CopyKind::DeviceToHost);
  else
    device_copy(device_.type, kernel_raw(), staged.kernel_raw(), nbytes(), CopyKind::DeviceToDevice);
}

void Tensor::fill(float value) {
  if (!on_host(*this)) {
    Tensor host = empty(shape_, dtype_);
    host.fill(value);
    copy_from(host);
    return;
  }
  size_t n = static_cast<size_t>(numel());
  switch (dtype_) {
    case DType::F32: std::fill_n(data<float>(), n, value); break;
    case DType::BF16: std::fill_n(data<uint16_t>(), n, f32_to_bf16(value)); break;
    case DType::F16: std::fill_n(data<uint16_t>(), n, f32_to_f16(value)); break;
    case DType::I32: std::fill_n(data<int32_t>(), n, static_cast<int32_t>(value)); break;
    default: {  // a block type: quantize one block of the value and repeat it
      std::vector<float> block(static_cast<size_t>(dtype_block_size(dtype_)), value);
      const size_t bb = dtype_block_bytes(dtype_);
      std::vector<uint8_t> q(bb);
      convert(block.data(), DType::F32, q.data(), dtype_, block.size());
      for (size_t off = 0; off < nbytes(); off += bb) std::memcpy(static_cast<uint8_t*>(raw()) + off, q.data(), bb);
    }
  }
}

void Tensor::zero() {
  device_zero(device_.type, kernel_raw(), nbytes());
}

std::vector<float> Tensor::to_vector() const {
  if (!on_host(*this)) return to(Device{}).to_vector();
  std::vector<float> v(static_cast<size_t>(numel()));
  if (dtype_ == DType::I32) {
    const int32_t* p = data<int32_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p[i]);
  } else {
    convert(raw(), dtype_, v.data(), DType::F32, v.size());
  }
  return v;
}

std::string Tensor::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_.str(), device_.name());
}

}  // namespace bp
