// The Collective (DESIGN.md "Distributed"): how the processes of one data-parallel run talk. The
// trainer sees only this interface; the implementations are an in-process one (one rank, every
// call trivial) and the MPI plugin (backend/mpi/collective_mpi.cpp, libbp_collective_mpi.so),
// loaded with dlopen only when the process was launched by mpirun / srun or asked for MPI, so
// `backprop` never links MPI. Later NCCL sits behind the same calls.
//
// Deterministic all-reduce. The plugin only moves bytes; the sums are done here, always in rank
// order, so two runs with the same number of ranks give the same bits whatever algorithm the MPI
// library would have picked for MPI_Allreduce (which may split, reorder or tree-sum differently
// from run to run and between rank counts). For a buffer of n floats, in segments of at most
// kReduceSegmentFloats:
//   1. reduce-scatter: the segment is cut into world chunks, chunk q = [m*q/W, m*(q+1)/W); an
//      all-to-all sends chunk q of every rank to rank q;
//   2. rank q sums its chunk over the ranks in order: ((x_0 + x_1) + x_2) + ... + x_{W-1}, in f32
//      (each element alone: vectorising across elements does not change any element's order);
//   3. all-gather: every rank receives every summed chunk, so all ranks hold identical bits.
// ZeRO-1's reduce-scatter is steps 1 and 2 alone: each rank's chunk gets the same bits.
// The result is bit-equal to a plain loop that adds the ranks' buffers in rank order, and within
// f32 rounding (W-1 additions: (W-1)·2^-24·Σ|x_r| per element) of the exact sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace bp {

// The processes' launch, read from the launcher's environment: Open MPI's mpirun
// (OMPI_COMM_WORLD_SIZE/RANK), a PMI launcher (PMI_SIZE/RANK: MPICH's, srun --mpi=pmi2) or a
// Slurm job step (SLURM_STEP_NUM_TASKS/SLURM_PROCID under srun). world 1: not launched as a group.
struct LaunchInfo {
  int world = 1;
  int rank = 0;
  std::string launcher;  // "mpirun", "pmi", "srun" or "" (a plain process)
  // This process's index among the ranks on its host (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
  // SLURM_LOCALID); -1 when the launcher does not say.
  int local_rank = -1;
};
LaunchInfo launch_from_environment();

// Floats summed per exchange (64 MiB): bounds the scratch memory of an all-reduce and keeps every
// MPI count far below 2^31 bytes.
inline constexpr size_t kReduceSegmentFloats = size_t{16} << 20;

// What this process's collectives cost, for the step records (metrics.jsonl comm_s, comm_bytes)
// and summary.json: the wall seconds spent inside them (on any thread; a call inside another counts
// once, as the outer one's) and the payload bytes this rank sent to the other ranks — what a
// point-to-point exchange of the same data moves (an all-to-all: the chunks for the other ranks;
// an all-gather: this rank's part, once to each other rank; a broadcast: the root's bytes to each
// other rank), which the MPI library's own algorithm may route differently. By what the time was
// for: the outermost scope's kind (CommScope) decides.
enum class CommKind { Other = 0, Gradients = 1, Parameters = 2 };
inline constexpr int kCommKinds = 3;
struct CommTotals {
  double seconds[kCommKinds] = {};
  uint64_t bytes[kCommKinds] = {};
  double total_seconds() const { return seconds[0] + seconds[1] + seconds[2]; }
  uint64_t total_bytes() const { return bytes[0] + bytes[1] + bytes[2]; }
  CommTotals operator-(const CommTotals& o) const {
    CommTotals d;
    for (int k = 0; k < kCommKinds; ++k) {
      d.seconds[k] = seconds[k] - o.seconds[k];
      d.bytes[k] = bytes[k] - o.bytes[k];
    }
    return d;
  }
};
// The totals so far (every Collective of the process, every thread).
CommTotals comm_totals();
// Times a collective call: the outermost scope on this thread adds its wall time to its kind's
// total; bytes added inside it (add_bytes, by the implementations' primitives) go to that kind.
class CommScope {
 public:
  explicit CommScope(CommKind kind = CommKind::Other);
  ~CommScope();
  CommScope(const CommScope&) = delete;
  CommScope& operator=(const CommScope&) = delete;
  static void add_bytes(uint64_t bytes);

 private:
  bool outer_;
  double start_ = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // "single" or "mpi"; and a line for logs ("Open MPI v4.1.4, 2 ranks").
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual std::string host_name() = 0;

  // Throws RUNTIME_DISTRIBUTED_RANK_LOST when another rank's process is gone (killed, crashed).
  // Checkable ranks are those on this host whose process this one could see at the start (its pid
  // and start time, all-gathered then); ranks elsewhere are noticed by the launcher, which ends the
  // job, or by the barrier's timeout. Cheap (a /proc read per local rank): the trainer calls it
  // between micro-batches, and every wait in a collective calls it every 100 ms.
  virtual void check_peers() {}

  // The primitives (collective: every rank calls them in the same order with matching sizes).
  // Failures throw RUNTIME_DISTRIBUTED_FAILED; a rank found gone while waiting,
  // RUNTIME_DISTRIBUTED_RANK_LOST (check_peers).
  //   barrier: every rank waits for all; a rank missing after timeout_s (<= 0: no limit) throws.
  virtual void barrier(double timeout_s) = 0;
  virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;
  // recv holds world() * bytes: rank r's bytes at r * bytes.
  virtual void all_gather_bytes(const void* send, size_t bytes, void* recv) = 0;
  // Counts and offsets per rank, each below 2^31 (the algorithms below keep them so).
  virtual void all_to_all_bytes(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                                const size_t* recv_bytes, const size_t* recv_offsets) = 0;
  virtual void all_gather_v_bytes(const void* send, size_t bytes, void* recv, const size_t* recv_bytes,
                                  const size_t* recv_offsets) = 0;

  // The algorithms, the same over every implementation.
  // Sum over ranks, deterministic (the header's comment): every rank ends with identical bits.
  void all_reduce_sum(float* data, size_t n) { all_reduce_sum(data, n, kReduceSegmentFloats); }
  // The same in segments of `segment_floats` (tests take small ones to cross segment borders).
  void all_reduce_sum(float* data, size_t n, size_t segment_floats);
  // The same over f32 tensors (host or device), packed into buckets of kReduceSegmentFloats.
  void all_reduce_sum(const std::vector<Tensor*>& tensors, size_t bucket_floats = kReduceSegmentFloats);
  // Steps 1 and 2 alone (ZeRO-1): this rank's chunk of every segment gets the rank-ordered sum, the
  // same bits the all-reduce gives it; the rest keeps this rank's own values. Half the traffic.
  void reduce_scatter_sum(float* data, size_t n, size_t segment_floats = kReduceSegmentFloats);
  void reduce_scatter_sum(const std::vector<Tensor*>& tensors, size_t bucket_floats = kReduceSegmentFloats);
  // Some of the tensors of a reduction now (the overlap of the backward pass, train/grad_overlap.h):
  // the tensors `which` of `tensors` (every rank the same), laid out as reduce_scatter_sum /
  // all_reduce_sum(tensors) lay them out (their values concatenated in order, in segments of
  // segment_floats, chunk q of each segment rank q's); each selected value gets the bits the whole
  // reduction gives it (gather: every value; else this rank's chunks'). f32 host tensors only.
  void reduce_part(const std::vector<Tensor*>& tensors, const std::vector<size_t>& which, bool gather,
                   size_t segment_floats = kReduceSegmentFloats);
  // Whether another thread than the one that started it may call this collective (one call at a
  // time: MPI_THREAD_SERIALIZED or more).
  virtual bool threads_may_communicate() const { return true; }
  // Every rank's value, in rank order.
  std::vector<int64_t> all_gather(int64_t value);
  std::vector<double> all_gather(double value);
  // Every rank's values (any count, 0 included) one after the other in rank order, on every rank.
  std::vector<double> all_gather_concat(const std::vector<double>& values);
  std::vector<float> all_gather_concat(const std::vector<float>& values);
  // Sum of every rank's value, added in rank order (identical on every rank).
  double sum_in_rank_order(double value);
  bool any(bool value);
  // Rank root's text on every rank.
  std::string broadcast(const std::string& text, int root);

 protected:
  // A collective that sums device tensors where they are (NCCL, ops/collective_nccl.h) does the
  // tensor reductions here and returns true; the default stages them through host memory.
  virtual bool reduce_on_device(const std::vector<Tensor*>& /*tensors*/, size_t /*bucket_floats*/, bool /*gather*/) {
    return false;
  }

 private:
  void reduce(float* data, size_t n, size_t segment_floats, bool gather);
  void reduce(const std::vector<Tensor*>& tensors, size_t bucket_floats, bool gather);
};

// The in-process collective of a single process (world 1).
std::unique_ptr<Collective> make_single_collective();

// The MPI plugin: `library` is its path, or "" to look beside the program (the folder of the
// binary holding this code, then ../lib/backprop, then the loader's search path). Loads it, starts
// MPI, and returns the collective; DEP_DISTRIBUTED_UNAVAILABLE when the plugin or the MPI library
// it needs cannot be loaded (the message says what was tried and the fix).
std::unique_ptr<Collective> load_mpi_collective(const std::string& library = "");

// Whether the MPI plugin would load (`backprop info`): its path, or why not. Does not start MPI.
struct PluginAvailability {
  bool available = false;
  std::string path;  // the plugin found
  std::string why;   // when not available
};
PluginAvailability mpi_plugin_availability(const std::string& library = "");
// The mpirun on PATH (then /usr/bin), or "" when there is none (`train --nproc`, `backprop info`).
std::string find_mpirun();

// The process's collective, made on first call: `mode` "auto" = MPI when the launcher's
// environment says more than one process (launch_from_environment), else single; "mpi" = MPI
// always; "single" = in-process. Later calls return the same one (the mode of the first call).
Collective& process_collective(const std::string& mode = "auto", const std::string& library = "");
// Ends MPI after a run every rank finished (cli/: after a successful `train`). After an error it
// is not called: finalizing while another rank waits in a collective would hang, and the launcher
// ends the other ranks when this one exits.
void finalize_process_collective();

}  // namespace bp
