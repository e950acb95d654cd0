#include "core/error.h"

#include <array>
#include <cinttypes>

namespace bp {

namespace {
constexpr ErrorInfo kCatalog[] = {
#define BP_ERROR(name, category, retryable, trigger, suggestion) \
  {ErrorCode::name, #name, category, Retryable::retryable, trigger, suggestion},
#include "core/error_catalog.inc"
#undef BP_ERROR
};
}  // namespace

std::span<const ErrorInfo> error_catalog() {
  return kCatalog;
}

const ErrorInfo& error_info(ErrorCode code) {
  return kCatalog[static_cast<size_t>(code)];
}

const ErrorInfo* find_error(std::string_view name) {
  for (const auto& e : kCatalog)
    if (name == e.name) return &e;
  return nullptr;
}

const char* retryable_name(Retryable r) {
  switch (r) {
    case Retryable::Yes: return "yes";
    case Retryable::No: return "no";
    case Retryable::Sometimes: return "sometimes";
  }
  return "no";
}

int exit_code_for(ErrorCode code) {
  if (code == ErrorCode::RUNTIME_TRAINING_ABORTED) return 130;
  std::string_view cat = error_info(code).category;
  return (cat == "config" || cat == "input") ? 1 : 2;
}

Error::Error(ErrorCode code, std::string message, nlohmann::json details)
    : std::runtime_error(std::move(message)),
      code_(code),
      details_(std::move(details)),
      suggestion_(error_info(code).suggestion) {}

std::string format_bytes(size_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

static std::string oom_message(const std::string& device, size_t req, size_t in_use, size_t cached, size_t limit,
                               size_t total) {
  size_t reserved = in_use + cached;
  size_t free_bytes = limit > reserved ? limit - reserved : 0;
  std::string msg = fmt::format(
      "[allocator] Out of memory. Tried to allocate {}. {} has a total capacity of {} of which {} is free "
      "(limit {}). Of the allocated memory {} is allocated, and {} is reserved but unallocated.",
      format_bytes(req), device, format_bytes(total), format_bytes(free_bytes), format_bytes(limit),
      format_bytes(in_use), format_bytes(cached));
  return msg;
}

OutOfMemoryError::OutOfMemoryError(std::string device_name, size_t bytes_requested, size_t bytes_in_use,
                                   size_t bytes_cached, size_t bytes_limit, size_t bytes_total)
    : Error(out_of_memory_code(device_name.size() >= 3 &&
                               (device_name.compare(0, 3, "CPU") == 0 || device_name.compare(0, 3, "cpu") == 0)),
            oom_message(device_name, bytes_requested, bytes_in_use, bytes_cached, bytes_limit, bytes_total),
            {{"device", device_name},
             {"bytes_requested", bytes_requested},
             {"bytes_in_use", bytes_in_use},
             {"bytes_cached", bytes_cached},
             {"bytes_limit", bytes_limit},
             {"bytes_total", bytes_total}}),
      bytes_requested_(bytes_requested),
      bytes_in_use_(bytes_in_use),
      bytes_cached_(bytes_cached),
      bytes_limit_(bytes_limit),
      bytes_total_(bytes_total) {}

}  // namespace bp
