// Child processes of `backprop ui`: training and export run as `backprop train` / `backprop
// export` in their own session (setsid, double fork), so the UI and a run survive each other and no
// zombie is left behind; short checks (validate, estimate-vram) run to completion and hand back
// their stdout. Also: which process holds a file open (how the UI knows a run is alive, whoever
// started it).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace bp::ui {

// Starts argv[0] with argv in a new session, stdin from /dev/null, stdout and stderr appended to the
// given files. Returns the pid of the started program (its parent is init, not this process).
pid_t spawn_detached(const std::vector<std::string>& argv, const std::string& stdout_path,
                     const std::string& stderr_path);

// Runs argv to completion; returns its exit status (-1 when it could not start) and its stdout
// (at most max_bytes) in *out. stderr is discarded.
int run_capture(const std::vector<std::string>& argv, std::string* out, size_t max_bytes = 8 << 20);

// Calls visit(pid, target) for every file descriptor of every process readable in /proc, until
// visit returns false.
void for_each_open_file(const std::function<bool(pid_t, const std::string& target)>& visit);

// This executable (/proc/self/exe).
std::string self_exe();

}  // namespace bp::ui
