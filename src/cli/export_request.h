// `backprop export`'s settings as an ExportRequest (export/exporter.h): the one mapping the command
// and the Python package's Trainer.export use.
#pragma once

#include <string>

#include "core/settings.h"
#include "export/exporter.h"

namespace bp::cli {

// export.* (format, quantization, output, ollama...), model.path (the adapter's base),
// training.output (where run ids are looked up); training.fault_inject_enospc_after_bytes >= 0
// arms the test's full disk.
ExportRequest export_request(const Settings& st, const std::string& input);

}  // namespace bp::cli
