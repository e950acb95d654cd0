#include "core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace bp {

namespace {
std::atomic<int> g_signal{0};

extern "C" void on_signal(int sig) {
  if (g_signal.exchange(sig) != 0) _exit(130);  // second signal: stop now
  static const char kMsg[] = "\nInterrupt received: finishing the current step and saving (again to stop now)\n";
  ssize_t n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  (void)n;
}
}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool interrupt_requested() {
  return g_signal.load() != 0;
}
int interrupt_signal() {
  return g_signal.load();
}
void clear_interrupt() {
  g_signal.store(0);
}
void request_interrupt(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}

}  // namespace bp
