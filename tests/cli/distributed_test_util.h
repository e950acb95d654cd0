// What the data-parallel CLI tests share (distributed_cli_test.cpp, distributed_faults_test.cpp):
// the data, the command line of a run, the mpirun prefix, and readers of a run folder.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/collective.h"
#include "support/test_util.h"

namespace bp::dist_test {

namespace fs = std::filesystem;

inline std::string model_dir() {
  return test::shared_dir() + "/models/stories260K";
}

inline std::string write_data(const std::string& dir, const std::string& name = "data.jsonl", int changed_row = -1) {
  const std::string p = dir + "/" + name;
  std::ofstream f(p);
  const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
  for (int i = 0; i < 24; ++i)
    f << "{\"text\": \"" << who[i % 5] << " saw a " << (i == changed_row ? "cat" : "bird") << " number " << i % 7
      << ". It was happy.\"}\n";
  return p;
}

// One process's (or one rank's) command: a global batch of 4 in micro-batches of 2, so a rank's
// share of 2 is one micro-batch, as each micro-batch of the single process is. The base is held in
// f32 (--base-dtype f32): the comparisons across micro-batch sizes are to f32 summation order, which
// a bf16 base (auto on a CPU with bf16 dot products) would turn into activation roundings of 2^-8.
inline std::string train_args(const std::string& data, const std::string& out, const std::string& extra = "",
                              const std::string& lr = "5e-3", const std::string& batch = "4") {
  return " train --device cpu --model " + model_dir() + " --data " + data + " --output " + out +
         " --steps 4 --batch-size " + batch + " --micro-batch-size " + (batch == "4" ? "2" : batch) + " --lr " + lr +
         " --warmup-steps 0 --lr-scheduler constant --lora-r 4 --lora-dropout 0 --max-seq-length 64 --holdout 0"
         " --threads 1 --seed 7 --base-dtype f32 " +
         extra;
}

// The environment of every command that starts ranks: under the sanitizer build, LeakSanitizer
// leaves Open MPI's own allocations alone (tests/support/lsan_openmpi.supp); elsewhere it is unused.
inline std::string rank_env() {
  return "LSAN_OPTIONS=suppressions=" + test::source_dir() +
         "/tests/support/lsan_openmpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 ";
}

// --timeout: a rank that hangs ends the job (and the test) in minutes, not at ctest's limit.
inline std::string mpirun_prefix(int np, const std::string& env = "") {
  return rank_env() + find_mpirun() +
         " --allow-run-as-root --oversubscribe --timeout 300 --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo " +
         env + " -np " + std::to_string(np) + " ";
}

#define SKIP_WITHOUT_MPIRUN()                                                                           \
  do {                                                                                                  \
    if (find_mpirun().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)"; \
  } while (0)

// The one run folder under a --output root (both ranks share rank 0's run id; rank 1 writes none).
inline std::string only_run(const std::string& root) {
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) runs.push_back(e.path().string());
  EXPECT_EQ(runs.size(), 1u) << root;
  return runs.empty() ? root : runs[0];
}

inline std::vector<nlohmann::json> records(const std::string& run, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

inline std::vector<double> losses(const std::string& run) {
  std::vector<double> out;
  for (const auto& r : records(run, "step")) out.push_back(r["loss"].is_null() ? NAN : r["loss"].get<double>());
  return out;
}

inline nlohmann::json summary(const std::string& run) {
  std::ifstream in(run + "/summary.json");
  return nlohmann::json::parse(in);
}

inline std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace bp::dist_test
