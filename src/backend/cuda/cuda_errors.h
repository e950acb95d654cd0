// How a CUDA / cuBLAS(Lt) / cuDNN failure becomes a bp::Error (host C++ only). Classified by the
// status NAME the library reports (cudaGetErrorName, cublasGetStatusName, cudnnGetErrorString),
// which is stable across versions where the numbers are not (cuDNN 9 renumbered its statuses):
// - out-of-memory inside a library (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED, the
//   NOT_INITIALIZED statuses a handle reports when it could not get its memory, cudaErrorMemory-
//   Allocation outside our allocator) -> RUNTIME_OOM_ADJACENT: the trainer's OOM recovery retries;
// - sticky errors (illegal address, launch failure, misaligned address, illegal instruction, ECC,
//   assert, launch timeout): the CUDA context is dead -> RUNTIME_GPU_KERNEL_FAULT, with the
//   CUDA_LAUNCH_BLOCKING=1 advice (the failing kernel is otherwise reported by a later call);
// - no driver / a driver older than the runtime / no device -> DEP_GPU_NOT_AVAILABLE;
// - anything else (invalid value, not supported: our bug) -> RUNTIME_INTERNAL.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace bp {

inline ErrorCode cuda_failure_code(std::string_view status_name) {
  auto has = [&](std::string_view s) { return status_name.find(s) != std::string_view::npos; };
  if (has("ALLOC_FAILED") || has("NOT_INITIALIZED") || has("MemoryAllocation") || has("out of memory"))
    return ErrorCode::RUNTIME_OOM_ADJACENT;
  for (std::string_view sticky :
       {"IllegalAddress", "LaunchFailure", "MisalignedAddress", "IllegalInstruction", "HardwareStackError", "InvalidPc",
        "InvalidAddressSpace", "ECCUncorrectable", "Assert", "LaunchTimeout", "EXECUTION_FAILED"})
    if (has(sticky)) return ErrorCode::RUNTIME_GPU_KERNEL_FAULT;
  if (has("InsufficientDriver") || has("NoDevice") || has("NotPermitted") || has("SystemDriverMismatch") ||
      has("CompatNotSupported"))
    return ErrorCode::DEP_GPU_NOT_AVAILABLE;
  return ErrorCode::RUNTIME_INTERNAL;
}

// "[cuda] <what> failed: <name> (<description>)" with the code's advice. `what` names the call.
inline Error cuda_failure(std::string_view what, std::string_view status_name, std::string_view description) {
  const ErrorCode code = cuda_failure_code(status_name);
  std::string msg = fmt::format("[cuda] {} failed: {} ({})", what, status_name, description);
  if (code == ErrorCode::RUNTIME_GPU_KERNEL_FAULT)
    msg +=
        ". The CUDA context is unusable after this error; the last saved checkpoint is kept. CUDA reports "
        "kernel faults at a later call: rerun with CUDA_LAUNCH_BLOCKING=1 to see which kernel failed";
  else if (code == ErrorCode::RUNTIME_OOM_ADJACENT)
    msg += ": a library could not get the GPU memory it needs";
  return Error(code, msg);
}

// What a failed cudaMalloc means. Only cudaErrorMemoryAllocation is out of memory (nullopt: the
// caching allocator empties its cache and retries, then the trainer's OOM recovery halves the
// batch). Anything else is thrown as what it is: a sticky error from an earlier kernel (illegal
// address) surfacing at cudaMalloc is a dead context, where halving the batch cannot help.
inline std::optional<Error> cuda_malloc_failure(std::string_view status_name, std::string_view description) {
  if (status_name == "cudaErrorMemoryAllocation") return std::nullopt;
  return cuda_failure("cudaMalloc", status_name, description);
}

// CUDA versions as the runtime reports them (1000·major + 10·minor) -> "12.4".
inline std::string cuda_version_string(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

// Throws DEP_GPU_NOT_AVAILABLE when no driver is loaded or it is older than the runtime this
// build was linked with. Only the major versions count: CUDA's minor-version compatibility runs a
// 13.1 runtime on a 13.0 driver (and 12.8 on a 12.4 one); a 12.x driver cannot run a 13.x runtime
// (cudart would fail every call with cudaErrorInsufficientDriver). CUDA 13 needs an R580 driver.
inline void check_driver_supports_runtime(int driver_version, int runtime_version) {
  if (driver_version == 0)
    throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE,
                fmt::format("[cuda] no NVIDIA driver is loaded; this build needs a driver for CUDA {}.x or newer",
                            runtime_version / 1000));
  if (driver_version / 1000 < runtime_version / 1000)
    throw Error(
        ErrorCode::DEP_GPU_NOT_AVAILABLE,
        fmt::format("[cuda] the NVIDIA driver supports CUDA {} but backprop was built with the CUDA {} "
                    "runtime: update the driver to one for CUDA {}.x{} (or use a build for CUDA {}.x)",
                    cuda_version_string(driver_version), cuda_version_string(runtime_version), runtime_version / 1000,
                    runtime_version / 1000 == 13 ? " (the 580 series or newer)" : "", driver_version / 1000));
}

// The oldest GPUs this build has kernels for: CMakeLists.txt compiles for sm_75, 80, 86, 89 and 90
// (+ PTX for newer cards); 7.5 (Turing: T4, RTX 20xx, GEMMs in f16) is the oldest target CUDA 13
// compiles for. An older card (a Volta V100 at 7.0) would fail every launch with "no kernel
// image", so it is reported unusable up front and `--device auto` trains on the CPU.
inline constexpr int kMinComputeCapabilityMajor = 7, kMinComputeCapabilityMinor = 5;

// Why device `name` with compute capability major.minor cannot train here; empty when it can.
inline std::string unsupported_device_reason(const std::string& name, int cc_major, int cc_minor) {
  if (cc_major > kMinComputeCapabilityMajor ||
      (cc_major == kMinComputeCapabilityMajor && cc_minor >= kMinComputeCapabilityMinor))
    return {};
  return fmt::format(
      "{} has compute capability {}.{}; this build's CUDA kernels need {}.{} or newer (Turing; CUDA 13, "
      "which this build uses, compiles for no older card), so training runs on the CPU",
      name, cc_major, cc_minor, kMinComputeCapabilityMajor, kMinComputeCapabilityMinor);
}

}  // namespace bp
