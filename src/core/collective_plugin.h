/* The C entry point of a collective plugin (DESIGN.md "Distributed"): the shared library that
 * links a communication library (libbp_collective_mpi.so links Open MPI's libmpi) and that
 * core/collective.cpp loads with dlopen only when a run needs it, so `backprop` itself never links
 * MPI. Plain C types only: the plugin and the program may be built by different compilers.
 *
 * The plugin moves bytes; it never adds. Sums are done by core/collective.cpp in a fixed rank
 * order, so the result does not depend on which algorithm the library picks. Every function
 * returns 0 on success; otherwise non-zero, with a message in `error` (a buffer of `error_size`
 * bytes, always NUL-terminated): 2 a barrier's timeout, 3 a wait the hook abandoned. All calls
 * are collective: every rank calls them in the same
 * order with matching sizes.
 */
#ifndef BP_CORE_COLLECTIVE_PLUGIN_H
#define BP_CORE_COLLECTIVE_PLUGIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_COLLECTIVE_PLUGIN_ABI 3
#define BP_COLLECTIVE_PLUGIN_SYMBOL "bp_collective_plugin_v1"

/* Called by the plugin about every 100 ms while a collective waits for the other ranks (every
 * collective below is started non-blocking and polled): a non-zero return abandons the wait, and
 * the call returns 3. The program uses it to notice a rank that is gone (killed, crashed) instead
 * of waiting for it forever. `waited_s`: how long this call has waited so far. */
typedef int (*bp_collective_wait_hook)(void* context, double waited_s);

typedef struct bp_collective_plugin {
  int abi;          /* BP_COLLECTIVE_PLUGIN_ABI */
  const char* name; /* "mpi" */
  /* Starts the library (MPI_Init_thread asking for MPI_THREAD_SERIALIZED: any thread may call, one
   * at a time — the overlap of the backward pass calls from a communication thread) and
   * says this process's rank and the number of ranks. `library_version` gets the library's own
   * version text (MPI_Get_library_version), cut to fit. */
  int (*init)(int* rank, int* world, char* library_version, size_t version_size, char* error, size_t error_size);
  /* Ends the library (MPI_Finalize): called once, only after a run every rank finished. */
  int (*finalize)(char* error, size_t error_size);
  /* Every rank waits for the others; returns 2 (and says so in `error`) when they have not all
   * arrived within timeout_s seconds (<= 0: wait forever). */
  int (*barrier)(double timeout_s, char* error, size_t error_size);
  /* `bytes` bytes of `buffer` on rank `root` are copied into `buffer` on every rank. */
  int (*broadcast)(void* buffer, size_t bytes, int root, char* error, size_t error_size);
  /* Every rank sends `bytes` bytes; recv (world * bytes) gets rank r's at offset r * bytes. */
  int (*all_gather)(const void* send, size_t bytes, void* recv, char* error, size_t error_size);
  /* All-to-all with counts: rank r sends send_bytes[q] bytes from send + send_offsets[q] to rank
   * q, and receives recv_bytes[q] bytes from rank q at recv + recv_offsets[q]. Each count must fit
   * an int (the caller splits larger exchanges). */
  int (*all_to_all)(const void* send, const size_t* send_bytes, const size_t* send_offsets, void* recv,
                    const size_t* recv_bytes, const size_t* recv_offsets, char* error, size_t error_size);
  /* Rank r contributes `bytes` bytes at `send`; recv gets rank q's recv_bytes[q] at recv_offsets[q]. */
  int (*all_gather_v)(const void* send, size_t bytes, void* recv, const size_t* recv_bytes, const size_t* recv_offsets,
                      char* error, size_t error_size);
  /* This rank's host name (MPI_Get_processor_name). */
  int (*host_name)(char* name, size_t name_size, char* error, size_t error_size);
  /* The hook every later wait calls (NULL: none). */
  void (*set_wait_hook)(bp_collective_wait_hook hook, void* context);
  /* The thread level MPI gave after init: 0 single, 1 funneled, 2 serialized, 3 multiple. */
  int (*thread_level)(void);
} bp_collective_plugin;

typedef const bp_collective_plugin* (*bp_collective_plugin_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* BP_CORE_COLLECTIVE_PLUGIN_H */
