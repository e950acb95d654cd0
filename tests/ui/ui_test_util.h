// Helpers for the `backprop ui` tests: start the real executable on a free 127.0.0.1 port with a
// temporary runs and dataset folder, wait until it answers, stop it with SIGINT; an httplib client
// with optional basic auth and extra headers.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"

namespace bp::test {

// A port nobody listens on right now (bind to 0, read it back, close).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Ends (SIGKILL) every process that holds `path` open: a test's training child left running after a
// failed assertion must not outlive the test (the UI starts them in their own session).
inline void kill_processes_holding(const std::string& path) {
  std::error_code ec;
  const auto want = std::filesystem::weakly_canonical(path, ec);
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = proc.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ec2;
    for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", ec2)) {
      std::error_code ec3;
      if (std::filesystem::read_symlink(fd.path(), ec3) == want) ::kill(std::stoi(name), SIGKILL);
    }
  }
}

class UiProcess {
 public:
  // Starts `backprop ui --port P --runs R --data-dir D <extra>` and waits (up to 60 s) until it answers.
  UiProcess(const std::string& runs, const std::string& data, std::vector<std::string> extra) : port_(free_port()) {
    std::vector<std::string> args = {backprop_exe(), "ui", "--port",     std::to_string(port_),
                                     "--runs",       runs, "--data-dir", data};
    args.insert(args.end(), extra.begin(), extra.end());
    // A client write to a connection the server has closed is an error for the test to see, not a
    // SIGPIPE that kills the test binary (and with it, before, the stop() below).
    ::signal(SIGPIPE, SIG_IGN);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // The server dies with the test binary whatever ends it: a server left running holds ctest's
      // output pipe open, and ctest then waits for its whole --timeout (seen in CI: 900 s).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600; ++i) {
      if (c.Get("/login")) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~UiProcess() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGINT);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool alive() const { return pid_ > 0; }
  int port() const { return port_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace bp::test
