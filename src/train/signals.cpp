#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace bp {

static std::atomic<int> g_stop_signal{0};
static std::atomic<int> g_sigint_count{0};

static void on_signal(int sig) {
  if (sig == SIGINT && g_sigint_count.fetch_add(1) >= 1) {
    static const char msg[] = "\n[backprop] second interrupt: exiting now\n";
    ssize_t r = ::write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(130);
  }
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  static const char msg[] =
      "\n[backprop] stopping after this step (checkpoint will be saved); interrupt again to exit now\n";
  ssize_t r = ::write(2, msg, sizeof msg - 1);
  (void)r;
}

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void uninstall_stop_handlers() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  g_stop_signal = 0;
  g_sigint_count = 0;
}

bool stop_requested() {
  return g_stop_signal.load() != 0;
}
void request_stop() {
  g_stop_signal = SIGTERM;
}
int stop_signal() {
  return g_stop_signal.load();
}

}  // namespace bp
