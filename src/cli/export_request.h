// `backprop export`'s settings as an ExportRequest (export/exporter.h): the one mapping the command
// and the Python package's Trainer.export use.
#pragma once

#include <string>

#include "core/settings.h"
#include "export/exporter.h"
#include "export/hub_push.h"

namespace bp::cli {

// export.* (format, quantization, output, ollama...), model.path (the adapter's base),
// training.output (where run ids are looked up); training.fault_inject_enospc_after_bytes >= 0
// arms the test's full disk.
ExportRequest export_request(const Settings& st, const std::string& input);

// `backprop push INPUT --repo REPO` and `export INPUT --push-to-hub REPO`: export_request plus the
// export.hub_* settings (revision, private, commit message, retries) and the hub's environment
// (HF_ENDPOINT, HF_TOKEN or the token file; the token is registered with the redactor). Upload
// progress goes to stderr, each step to the log.
PushRequest push_request(const Settings& st, const std::string& input, const std::string& repo);
// The text summary of a push (stdout).
void print_push_report(const PushReport& r);

}  // namespace bp::cli
