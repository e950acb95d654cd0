// `train --nproc N` (N > 1) outside a launcher: this same command line again under
// `mpirun -np N` on this machine, over 127.0.0.1 only (the ranks' out-of-band and TCP traffic on
// the loopback; Open MPI moves the data through shared memory). --oversubscribe lets N exceed the
// cores; --allow-run-as-root is Open MPI's consent to run as root (containers). Each rank sees
// mpirun's environment and trains (training.distributed auto); --nproc is not acted on again there.
//
// This process stays mpirun's parent (fork + exec, not exec) so that the user always gets a coded
// answer, whatever Open MPI does:
//   - Ctrl-C / SIGTERM here becomes SIGUSR1 to mpirun, which forwards it to every rank (mpirun's own
//     answer to SIGINT and SIGTERM is to end the job: SIGCONT, SIGTERM 1 s later, SIGKILL 1 s after
//     that, odls_base_sigkill_timeout, too soon for a checkpoint). The ranks finish the step, agree,
//     rank 0 saves one checkpoint, and they exit 130, as one process does. A second Ctrl-C sends
//     SIGTERM: Open MPI's hard stop. mpirun runs in its own process group, so the terminal's Ctrl-C
//     reaches this process only, and it dies with this process (PR_SET_PDEATHSIG).
//   - mpirun's stderr passes through here (and its tail is kept): when a rank was killed and no
//     surviving rank could say so (the launcher ended them first), mpirun's own line ("process rank
//     1 with PID 0 on node vm exited on signal 9") becomes RUNTIME_DISTRIBUTED_RANK_LOST with the
//     rank, its host and the checkpoint --resume latest continues from.
#include "cli/mpirun_launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/collective.h"
#include "core/error.h"
#include "core/log.h"
#include "core/settings.h"
#include "train/resume.h"
#include "train/train_options.h"

namespace bp::cli {

namespace {

std::atomic<pid_t> g_child{0};  // lock-free: safe in a signal handler
std::atomic<int> g_signals{0};

extern "C" void forward_stop(int) {
  const int n = ++g_signals;
  if (const pid_t child = g_child.load(); child > 0) ::kill(child, n == 1 ? SIGUSR1 : SIGTERM);
  static const char kFirst[] =
      "\nInterrupt received: every rank finishes the current step and rank 0 saves a checkpoint (again to stop "
      "now)\n";
  static const char kSecond[] = "\nSecond interrupt: ending the ranks now\n";
  ssize_t w =
      n == 1 ? ::write(STDERR_FILENO, kFirst, sizeof kFirst - 1) : ::write(STDERR_FILENO, kSecond, sizeof kSecond - 1);
  (void)w;
}

// This command line as it was started (/proc/self/cmdline: NUL-separated).
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t b = 0; b < cmdline.size();) {
    const size_t e = cmdline.find('\0', b);
    args.push_back(cmdline.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return args;
}

// The checkpoint `--resume latest` would continue from, said for the error message.
std::string last_checkpoint_text() {
  try {
    TrainOptions o = TrainOptions::from_settings(settings());
    o.resume = "latest";
    std::string run_dir;
    if (const auto ck = find_resume_checkpoint(o, &run_dir, [](const std::string&) {}))
      return fmt::format("the last saved checkpoint is {} (step {}): continue from it with --resume latest", ck->path,
                         ck->step);
  } catch (const std::exception&) {
  }
  return "no checkpoint was saved before it (--save-every N saves one every N steps)";
}

}  // namespace

int run_under_mpirun(int64_t nproc) {
  const std::string mpirun = find_mpirun();
  if (mpirun.empty())
    throw Error(ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
                fmt::format("[train] --nproc {} runs `mpirun -np {}`, but mpirun is not installed", nproc, nproc))
        .with_suggestion("apt-get install openmpi-bin libopenmpi-dev, or train in one process (--nproc 1).");
  const PluginAvailability plugin = mpi_plugin_availability(settings().get_string("training.mpi_library"));
  if (!plugin.available)
    throw Error(ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
                fmt::format("[train] --nproc {}: the MPI collective plugin cannot be loaded ({})", nproc, plugin.why))
        .with_suggestion(
            "Install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and rebuild, so libbp_collective_mpi.so "
            "is built beside backprop.");
  const std::vector<std::string> args = own_command_line();
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (args.empty() || self.empty())
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[train] --nproc: cannot read this process's command line");
  std::vector<std::string> argv = {mpirun};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  for (const char* a : {"--oversubscribe", "--host", "127.0.0.1", "--mca", "oob_tcp_if_include", "lo", "--mca",
                        "btl_tcp_if_include", "lo", "-np"})
    argv.push_back(a);
  argv.push_back(std::to_string(nproc));
  argv.push_back(self);
  argv.insert(argv.end(), args.begin() + 1, args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  spdlog::info("--nproc {}: {}", nproc, fmt::format("{}", fmt::join(argv, " ")));
  log::flush();
  std::fflush(stdout);
  std::fflush(stderr);

  int err_pipe[2];
  if (::pipe(err_pipe) != 0)
    throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[train] --nproc: pipe: {}", std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0)
    throw Error(ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE,
                fmt::format("[train] --nproc {}: cannot start {}: {}", nproc, mpirun, std::strerror(errno)));
  if (child == 0) {  // mpirun: its own process group, stdin from /dev/null, stderr into the pipe
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(130);  // the launcher is already gone
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    ::execv(mpirun.c_str(), cargv.data());
    const std::string msg =
        fmt::format("[train] --nproc {}: could not start {}: {}\n", nproc, mpirun, std::strerror(errno));
    ssize_t w = ::write(STDERR_FILENO, msg.data(), msg.size());
    (void)w;
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  g_child.store(child);
  struct sigaction sa {};
  sa.sa_handler = forward_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: read() and waitpid() return EINTR and are called again
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // mpirun's stderr (the ranks' warnings and errors) passes through; the tail is kept for the end.
  std::string tail;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(err_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ssize_t off = 0;
    while (off < n) {
      const ssize_t w = ::write(STDERR_FILENO, buf + off, static_cast<size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += w;
    }
    tail.append(buf, static_cast<size_t>(n));
    if (tail.size() > (size_t{128} << 10)) tail.erase(0, tail.size() - (size_t{64} << 10));
  }
  ::close(err_pipe[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (rc == 0 || rc == 3) return rc;
  const std::string lost_code = error_info(ErrorCode::RUNTIME_DISTRIBUTED_RANK_LOST).name;
  if (tail.find("[" + lost_code + "]") != std::string::npos)  // a surviving rank said which and what is saved
    return exit_code_for(ErrorCode::RUNTIME_DISTRIBUTED_RANK_LOST);
  if (g_signals.load() > 0) return exit_code_for(ErrorCode::RUNTIME_TRAINING_ABORTED);  // stopped as asked: 130
  // Open MPI's own account of a rank that died ("process rank 1 with PID 0 on node vm exited on
  // signal 9 (Killed)"; its PID is not always filled in).
  static const std::regex died(
      R"(process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)( \([^)]*\))?)");
  // Its line only (std::regex over the whole tail would be slow).
  std::string line;
  if (const size_t at = tail.find(" exited on signal "); at != std::string::npos) {
    const size_t nl = tail.rfind('\n', at), end = tail.find('\n', at);
    const size_t b = nl == std::string::npos ? 0 : nl + 1, e = end == std::string::npos ? tail.size() : end;
    line = tail.substr(b, e - b);
  }
  std::smatch m;
  if (std::regex_search(line, m, died))
    throw Error(ErrorCode::RUNTIME_DISTRIBUTED_RANK_LOST,
                fmt::format("[train] --nproc {}: rank {} (on host {}) died of signal {}{} and mpirun ended the other "
                            "ranks; {}",
                            nproc, m[1].str(), m[3].str(), m[4].str(), m[5].str(), last_checkpoint_text()),
                {{"lost_rank", std::stoi(m[1].str())}, {"lost_host", m[3].str()}, {"signal", std::stoi(m[4].str())}});
  return rc;  // the ranks said what went wrong
}

}  // namespace bp::cli
