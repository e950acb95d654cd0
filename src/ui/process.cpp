// Child processes of `backprop ui` (process.h).
#include "ui/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace bp::ui {

namespace fs = std::filesystem;

namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> v;
  for (const auto& a : argv) v.push_back(const_cast<char*>(a.c_str()));
  v.push_back(nullptr);
  return v;
}

void close_other_fds() {
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
}

}  // namespace

std::string self_exe() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).string();
}

pid_t spawn_detached(const std::vector<std::string>& argv, const std::string& stdout_path,
                     const std::string& stderr_path) {
  int pipe_fd[2];
  if (::pipe(pipe_fd) != 0) return -1;
  std::vector<char*> args = c_argv(argv);  // built before fork: no allocation in the child
  const pid_t first = ::fork();
  if (first < 0) return -1;
  if (first == 0) {
    ::setsid();
    const pid_t second = ::fork();
    if (second != 0) {
      (void)!::write(pipe_fd[1], &second, sizeof second);
      ::_exit(0);
    }
    // The program itself: a session of its own, default signal handling, files for its output.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (in < 0 || out < 0 || err < 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    close_other_fds();
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fd[1]);
  pid_t pid = -1;
  if (::read(pipe_fd[0], &pid, sizeof pid) != sizeof pid) pid = -1;
  ::close(pipe_fd[0]);
  int status = 0;
  ::waitpid(first, &status, 0);
  return pid;
}

int run_capture(const std::vector<std::string>& argv, std::string* out, size_t max_bytes) {
  int pipe_fd[2];
  if (::pipe(pipe_fd) != 0) return -1;
  std::vector<char*> args = c_argv(argv);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::dup2(pipe_fd[1], 1);
    ::dup2(devnull, 2);
    close_other_fds();
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipe_fd[1]);
  out->clear();
  char buf[65536];
  ssize_t n;
  while ((n = ::read(pipe_fd[0], buf, sizeof buf)) > 0)
    if (out->size() < max_bytes) out->append(buf, static_cast<size_t>(n));
  ::close(pipe_fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void for_each_open_file(const std::function<bool(pid_t, const std::string& target)>& visit) {
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string name = proc.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ec2;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", ec2)) {
      std::error_code ec3;
      const fs::path target = fs::read_symlink(fd.path(), ec3);
      if (!ec3 && !visit(static_cast<pid_t>(std::atoi(name.c_str())), target.string())) return;
    }
  }
}

}  // namespace bp::ui
