// NCCL (NVIDIA's collective library), loaded with dlopen at run time: `backprop` never links it,
// so a machine without it (every CPU-only one) runs unchanged, and a CUDA data-parallel run finds
// the libnccl.so.2 the CUDA toolkit or the distribution installed. Only the few calls the
// data-parallel step makes are resolved: the communicator (ncclGetUniqueId, ncclCommInitRank,
// ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError) and point-to-point moves of bytes
// (ncclGroupStart/End, ncclSend, ncclRecv, ncclBroadcast). No NCCL reduction is called: the sums
// are added on the device in rank order (ops/collective_nccl.h), so the bits do not depend on the
// ring or tree NCCL would pick. The collective that uses it is ops/collective_nccl.h.
#pragma once

#include <cstddef>
#include <string>

namespace bp {

// The C types of nccl.h, as plain types (ABI-stable since NCCL 2.0).
struct NcclUniqueId {
  char internal[128];
};
using NcclComm = void*;                 // ncclComm_t
using NcclResult = int;                 // ncclResult_t: 0 ncclSuccess, 7 ncclInProgress
inline constexpr int kNcclFloat32 = 7;  // ncclDataType_t ncclFloat32

struct NcclApi {
  NcclResult (*get_version)(int* version) = nullptr;
  const char* (*get_error_string)(NcclResult) = nullptr;
  NcclResult (*get_unique_id)(NcclUniqueId* id) = nullptr;
  NcclResult (*comm_init_rank)(NcclComm* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  NcclResult (*comm_destroy)(NcclComm comm) = nullptr;
  NcclResult (*comm_abort)(NcclComm comm) = nullptr;
  NcclResult (*comm_get_async_error)(NcclComm comm, NcclResult* error) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;
  NcclResult (*send)(const void* buf, size_t count, int datatype, int peer, NcclComm comm, void* stream) = nullptr;
  NcclResult (*recv)(void* buf, size_t count, int datatype, int peer, NcclComm comm, void* stream) = nullptr;
  NcclResult (*broadcast)(const void* send, void* recv, size_t count, int datatype, int root, NcclComm comm,
                          void* stream) = nullptr;
  std::string path;  // the library loaded
  int version = 0;   // ncclGetVersion: 22304 = 2.23.4
};

struct NcclAvailability {
  bool available = false;
  std::string path, version;  // the library found and its version ("2.23.4")
  std::string why;            // when not available: every place tried
};

// The places looked at for `library` ("" = libnccl.so.2 on the loader's path, then the CUDA
// toolkit's /usr/local/cuda/lib64, lib and targets/<arch>/lib; a name or path = that one alone).
// Loads it once per path and keeps it loaded; null and `why` when it cannot be loaded or lacks a
// symbol (an NCCL older than 2.7, which has no ncclSend/ncclRecv).
const NcclApi* load_nccl(const std::string& library, std::string* why);
// `backprop info`: whether it loads (the default search), and its version.
NcclAvailability nccl_availability(const std::string& library = "");
// "2.23.4" from ncclGetVersion's integer (2.9+: major*10000 + minor*100 + patch; older: *1000).
std::string nccl_version_text(int version);

}  // namespace bp
