// bp::Error and the error catalog (DESIGN.md "Errors").
//
// Library code throws bp::Error with a catalog code, a "[component]" prefix in the message
// and the real numbers; only cli/ and ui/ turn errors into exit codes. The catalog itself is
// error_catalog.inc: one X-macro table that the enum, docs/errors.md and `info` come from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bp {

enum class Retryable { Yes, No, Sometimes };

enum class ErrorCode {
#define BP_ERROR(name, category, retryable, trigger, suggestion) name,
#include "core/error_catalog.inc"
#undef BP_ERROR
};

struct ErrorInfo {
  ErrorCode code;
  const char* name;      // "RUNTIME_GPU_OOM"
  const char* category;  // "config", "input", "dependency", "runtime", "state"
  Retryable retryable;
  const char* trigger;     // what makes it happen
  const char* suggestion;  // what the user should do
};

// Every entry, in catalog order.
std::span<const ErrorInfo> error_catalog();
const ErrorInfo& error_info(ErrorCode code);
// Lookup by name ("STATE_DISK_FULL"); nullptr when unknown.
const ErrorInfo* find_error(std::string_view name);
const char* retryable_name(Retryable r);  // "yes" / "no" / "sometimes"
// Process exit code for an error: 1 for user errors (config, input), 2 otherwise,
// 130 for RUNTIME_TRAINING_ABORTED.
int exit_code_for(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, nlohmann::json details = nlohmann::json::object());
  ErrorCode code() const { return code_; }
  const ErrorInfo& info() const { return error_info(code_); }
  const nlohmann::json& details() const { return details_; }
  // A suggestion for this occurrence; falls back to the catalog's.
  const std::string& suggestion() const { return suggestion_; }
  Error& with_suggestion(std::string s) {
    suggestion_ = std::move(s);
    return *this;
  }

 private:
  ErrorCode code_;
  nlohmann::json details_;
  std::string suggestion_;
};

// Thrown by allocators past their limit (DESIGN.md "Allocators"). Code RUNTIME_CPU_OOM when
// device_name names the CPU ("CPU", "cpu"), else RUNTIME_GPU_OOM; the message follows PyTorch's
// wording so users recognise it.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string device_name, size_t bytes_requested, size_t bytes_in_use, size_t bytes_cached,
                   size_t bytes_limit, size_t bytes_total);
  size_t bytes_requested() const { return bytes_requested_; }
  size_t bytes_in_use() const { return bytes_in_use_; }
  size_t bytes_cached() const { return bytes_cached_; }
  size_t bytes_limit() const { return bytes_limit_; }
  size_t bytes_total() const { return bytes_total_; }

 private:
  size_t bytes_requested_, bytes_in_use_, bytes_cached_, bytes_limit_, bytes_total_;
};

// The out-of-memory code for a device: RUNTIME_CPU_OOM for host memory, RUNTIME_GPU_OOM for a card.
inline ErrorCode out_of_memory_code(bool on_cpu) {
  return on_cpu ? ErrorCode::RUNTIME_CPU_OOM : ErrorCode::RUNTIME_GPU_OOM;
}

// "2.00 GiB", "512.00 KiB", "17 bytes" — the units PyTorch prints.
std::string format_bytes(size_t bytes);

// Throws bp::Error(RUNTIME_INTERNAL) — for invariants between components, never for user input.
#define BP_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) throw ::bp::Error(::bp::ErrorCode::RUNTIME_INTERNAL, ::fmt::format(__VA_ARGS__)); \
  } while (0)

}  // namespace bp

#include <fmt/format.h>
