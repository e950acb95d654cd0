// The GGUF oracle shared by the io/ and export/ tests (definitions in gguf_oracle.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf_reader.h"

namespace bp::gguf_testing {

// Runs tests/oracles/gguf_read.mjs (@huggingface/gguf) on `path`; fails the test when node or the
// npm package is missing: an oracle test never skips silently.
nlohmann::json oracle_read(const std::string& path);

// Every metadata value (type, element type, value) and tensor-table entry of our reader equals the oracle's.
void expect_oracle_matches(const nlohmann::json& o, const GGUFReader& r);

}  // namespace bp::gguf_testing
