// Cooperative interruption (exit code 130). A command that can stop cleanly (train) calls
// install_interrupt_handler(); the first SIGINT/SIGTERM/SIGUSR1 only sets a flag that its loop
// polls (finish the step, save, then throw RUNTIME_TRAINING_ABORTED, which main maps to exit code
// 130); a second signal ends the process at once with exit code 130. SIGUSR1 is the one Open MPI's
// mpirun forwards to every rank (it ends the job itself on SIGINT and SIGTERM): `train --nproc`
// turns a Ctrl-C into it, and `kill -USR1 <mpirun's pid>` stops a plain mpirun run the same way.
#pragma once

namespace bp {

void install_interrupt_handler();
bool interrupt_requested();
// The signal number that requested the interrupt (0 when none).
int interrupt_signal();
void clear_interrupt();  // for tests and for a resumed loop
// Asks the loop to stop as if `sig` had arrived (no second-signal exit): the Python package's
// KeyboardInterrupt and its callback's `False` take the same path as Ctrl-C in the CLI.
void request_interrupt(int sig);

}  // namespace bp
