// libbp_collective_mpi.so: the MPI collective plugin (core/collective_plugin.h). Built only when
// CMake finds MPI (BACKPROP_MPI), linked against libmpi, loaded by core/collective.cpp with dlopen
// when a run is launched by mpirun or srun. It moves bytes only (MPI_BYTE): every sum is done by
// the caller in rank order, so results never depend on the reduction algorithm MPI would pick.
//
// Errors come back as return codes (MPI_ERRORS_RETURN on MPI_COMM_WORLD), never as MPI's default
// abort, so the program can throw its catalog error. Counts above INT_MAX are the caller's to
// split (core/collective.cpp exchanges at most kMaxExchangeBytes at a time).
//
// Every collective is started non-blocking (MPI_Ibarrier, MPI_Ibcast, MPI_Iallgather,
// MPI_Ialltoallv, MPI_Iallgatherv) and polled with MPI_Test: a blocking call whose peer was
// killed never returns (Open MPI's shared-memory transport does not notice a dead peer), while a
// polled one asks the program's wait hook every 100 ms whether to keep waiting (the program checks
// that the other ranks' processes are still alive: core/collective.cpp). The poll spins (with
// sched_yield, as Open MPI's own blocking wait spins) for the first second, which keeps a large
// exchange progressing at full speed, then sleeps 200 us between tests: a rank that waits long for a
// slower one leaves the cores to it.
#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/collective_plugin.h"

namespace {

void say(char* error, size_t error_size, const char* what, int code) {
  if (!error || error_size == 0) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (code != MPI_SUCCESS && MPI_Error_string(code, text, &len) != MPI_SUCCESS) text[0] = 0;
  std::snprintf(error, error_size, "%s failed: %s (MPI error %d)", what, text, code);
}

bool fits_int(size_t n) {
  return n <= static_cast<size_t>(INT_MAX);
}

int check_counts(const size_t* counts, const size_t* offsets, int world, std::vector<int>& c, std::vector<int>& o,
                 char* error, size_t error_size) {
  c.resize(static_cast<size_t>(world));
  o.resize(static_cast<size_t>(world));
  for (int q = 0; q < world; ++q) {
    if (!fits_int(counts[q]) || !fits_int(offsets[q])) {
      std::snprintf(error, error_size, "exchange of %zu bytes at offset %zu is larger than MPI's int counts", counts[q],
                    offsets[q]);
      return 1;
    }
    c[static_cast<size_t>(q)] = static_cast<int>(counts[q]);
    o[static_cast<size_t>(q)] = static_cast<int>(offsets[q]);
  }
  return 0;
}

bp_collective_wait_hook g_hook = nullptr;
void* g_hook_context = nullptr;

// What MPI_Init_thread gave (MPI_Query_thread), as 0 single .. 3 multiple.
int mpi_thread_level() {
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&provided) != MPI_SUCCESS) return 0;
  return provided >= MPI_THREAD_MULTIPLE     ? 3
         : provided >= MPI_THREAD_SERIALIZED ? 2
         : provided >= MPI_THREAD_FUNNELED   ? 1
                                             : 0;
}

void mpi_set_wait_hook(bp_collective_wait_hook hook, void* context) {
  g_hook = hook;
  g_hook_context = context;
}

// Polls a started collective until it completes: 0 done, 1 an MPI error, 2 past timeout_s (> 0),
// 3 abandoned by the wait hook. The request is left as it is on 2 and 3: the program stops.
int wait_for(MPI_Request& req, const char* what, double timeout_s, char* error, size_t error_size) {
  const auto start = std::chrono::steady_clock::now();
  double next_hook = 0.1;
  for (int done = 0;;) {
    const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      say(error, error_size, what, rc);
      return 1;
    }
    if (done) return 0;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      std::snprintf(error, error_size, "%s: not every rank arrived within %.0f s", what, timeout_s);
      return 2;
    }
    if (g_hook && waited >= next_hook) {
      next_hook = waited + 0.1;
      if (g_hook(g_hook_context, waited) != 0) {
        std::snprintf(error, error_size, "%s abandoned after %.1f s", what, waited);
        return 3;
      }
    }
    if (waited < 1.0)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Starts a collective (rc of the MPI_I* call) and waits for it.
int started(int rc, MPI_Request& req, const char* what, double timeout_s, char* error, size_t error_size) {
  if (rc != MPI_SUCCESS) {
    say(error, error_size, what, rc);
    return 1;
  }
  return wait_for(req, what, timeout_s, error, error_size);
}

int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

int mpi_init(int* rank, int* world, char* version, size_t version_size, char* error, size_t error_size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
      say(error, error_size, "MPI_Init_thread", rc);
      return 1;
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, world);
  if (version && version_size > 0) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) text[0] = 0;
    // The first line is enough ("Open MPI v4.1.4, package: ...").
    for (char* p = text; *p; ++p)
      if (*p == '\n' || *p == ',') {
        *p = 0;
        break;
      }
    std::snprintf(version, version_size, "%s", text);
  }
  return 0;
}

int mpi_finalize(char* error, size_t error_size) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return 0;
  const int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) {
    say(error, error_size, "MPI_Finalize", rc);
    return 1;
  }
  return 0;
}

// A rank that never arrives (crashed, hung) ends the wait after timeout_s instead of blocking forever.
int mpi_barrier(double timeout_s, char* error, size_t error_size) {
  MPI_Request req;
  return started(MPI_Ibarrier(MPI_COMM_WORLD, &req), req, "MPI_Ibarrier", timeout_s, error, error_size);
}

int mpi_broadcast(void* buffer, size_t bytes, int root, char* error, size_t error_size) {
  if (!fits_int(bytes)) {
    std::snprintf(error, error_size, "broadcast of %zu bytes is larger than MPI's int counts", bytes);
    return 1;
  }
  MPI_Request req;
  return started(MPI_Ibcast(buffer, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req), req, "MPI_Ibcast",
                 0, error, error_size);
}

int mpi_all_gather(const void* send, size_t bytes, void* recv, char* error, size_t error_size) {
  if (!fits_int(bytes)) {
    std::snprintf(error, error_size, "all-gather of %zu bytes is larger than MPI's int counts", bytes);
    return 1;
  }
  MPI_Request req;
  return started(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                                MPI_COMM_WORLD, &req),
                 req, "MPI_Iallgather", 0, error, error_size);
}

int mpi_all_to_all(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                   const size_t* recv_bytes, const size_t* recv_offsets, char* error, size_t error_size) {
  const int w = world_size();
  std::vector<int> sc, so, rcnt, ro;
  if (check_counts(send_bytes, send_offsets, w, sc, so, error, error_size) ||
      check_counts(recv_bytes, recv_offsets, w, rcnt, ro, error, error_size))
    return 1;
  MPI_Request req;
  return started(MPI_Ialltoallv(send, sc.data(), so.data(), MPI_BYTE, recv, rcnt.data(), ro.data(), MPI_BYTE,
                                MPI_COMM_WORLD, &req),
                 req, "MPI_Ialltoallv", 0, error, error_size);
}

int mpi_all_gather_v(const void* send, size_t bytes, void* recv, const size_t* recv_bytes, const size_t* recv_offsets,
                     char* error, size_t error_size) {
  const int w = world_size();
  std::vector<int> rcnt, ro;
  if (!fits_int(bytes)) {
    std::snprintf(error, error_size, "all-gather of %zu bytes is larger than MPI's int counts", bytes);
    return 1;
  }
  if (check_counts(recv_bytes, recv_offsets, w, rcnt, ro, error, error_size)) return 1;
  MPI_Request req;
  return started(MPI_Iallgatherv(send, static_cast<int>(bytes), MPI_BYTE, recv, rcnt.data(), ro.data(), MPI_BYTE,
                                 MPI_COMM_WORLD, &req),
                 req, "MPI_Iallgatherv", 0, error, error_size);
}

int mpi_host_name(char* name, size_t name_size, char* error, size_t error_size) {
  char text[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  const int rc = MPI_Get_processor_name(text, &len);
  if (rc != MPI_SUCCESS) {
    say(error, error_size, "MPI_Get_processor_name", rc);
    return 1;
  }
  std::snprintf(name, name_size, "%s", text);
  return 0;
}

const bp_collective_plugin kPlugin = {
    BP_COLLECTIVE_PLUGIN_ABI, "mpi",          mpi_init,         mpi_finalize,  mpi_barrier,       mpi_broadcast,
    mpi_all_gather,           mpi_all_to_all, mpi_all_gather_v, mpi_host_name, mpi_set_wait_hook, mpi_thread_level};

}  // namespace

extern "C" __attribute__((visibility("default"))) const bp_collective_plugin* bp_collective_plugin_v1(void) {
  return &kPlugin;
}
