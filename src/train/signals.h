// SIGINT/SIGTERM during training: the first one asks the loop to finish the current step, save a
// checkpoint and exit 130; a second SIGINT exits at once (130). Handlers only set flags.
#pragma once

namespace bp {

void install_stop_handlers();
void uninstall_stop_handlers();
bool stop_requested();
void request_stop();  // tests and the UI
int stop_signal();    // the signal that asked (0 if none)

}  // namespace bp
