#include "core/threads.h"

#include <omp.h>

#include <thread>

extern "C" {
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace bp {

static int g_threads = 0;

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : hardware_threads();
  omp_set_num_threads(g_threads);
  openblas_set_num_threads(g_threads);
}

int num_threads() {
  return g_threads > 0 ? g_threads : hardware_threads();
}

const char* blas_name() {
  return openblas_get_config();
}

const char* blas_core_name() {
  return openblas_get_corename();
}

int blas_num_threads() {
  return openblas_get_num_threads();
}

}  // namespace bp
