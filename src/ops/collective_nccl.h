// The NCCL collective (DESIGN.md "Distributed"; core/collective.h): a data-parallel run whose
// model trains on CUDA devices (one rank per GPU) sums its gradients where they are, GPU to GPU,
// instead of staging them through host memory over MPI.
//
// It is the MPI collective with NCCL beside it: the communicator is bootstrapped over MPI (rank 0's
// ncclGetUniqueId broadcast with the host collective, then ncclCommInitRank on every rank), every
// host-side call (barrier, broadcasts, the all-gathers of scalars, the peers' liveness) stays
// MPI's, and the gradient all-reduce and ZeRO-1 reduce-scatter of device tensors run on the device
// (reduce_on_device), with the host path's algorithm and bits:
//   1. the segment's chunk q of every rank to rank q: ncclSend/ncclRecv pairs in one NCCL group
//      (rank q's own chunk copied on the device);
//   2. rank q adds the W copies in rank order, ((x_0 + x_1) + x_2) + ..., with the device's
//      elementwise add (f32, one rounding per addition: the host loop's bits);
//   3. (all-reduce only) every summed chunk to every rank: W ncclBroadcast calls in one group.
// NCCL moves bytes and never adds, so the result does not depend on NCCL's algorithm (ring, tree,
// NVLS), protocol, channel count or topology: NCCL itself promises the same bits only for the same
// algorithm, protocol, rank count and topology (its ring's order is fixed for a fixed ring; NVLS
// reduces in the switch), and its choice changes with message size and hardware.
// Everything runs on the default stream, where the CUDA backend's kernels run, so it is ordered
// with them; the call returns once the stream is idle, polling it (and NCCL's asynchronous error,
// and every 100 ms the peers, as the MPI waits do) so a rank that died ends the wait with
// RUNTIME_DISTRIBUTED_RANK_LOST instead of hanging in a kernel.
#pragma once

#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/collective.h"

namespace bp {

// The NCCL collective over `host` (the MPI collective, which it keeps using and must outlive it)
// for tensors on `device`. `library`: "" = libnccl.so.2 from the loader's path or the CUDA toolkit
// (core/nccl.h), else that file. Throws DEP_DISTRIBUTED_UNAVAILABLE when it cannot be loaded,
// RUNTIME_DISTRIBUTED_FAILED when the communicator cannot be made. Collective: every rank calls it.
std::unique_ptr<Collective> make_nccl_collective(Collective& host, Device device, const std::string& library);

}  // namespace bp
