// The built `backprop` binary: info (text and --json), --env-vars, --error-codes, the error
// format and envelope, exit codes, redaction in printed errors and log sinks, docs/errors.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/settings.h"
#include "support/fake_system_root.h"
#include "support/test_util.h"

namespace bp {
namespace {

struct Result {
  int rc;
  std::string out;
};

// Runs backprop with `args`; stdout_only drops stderr (for JSON parsing).
Result backprop(const std::string& args, const std::string& env = "", bool stdout_only = false) {
  std::string cmd =
      "{ env " + env + " " + test::backprop_exe() + " " + args + (stdout_only ? " 2>/dev/null; }" : "; }");
  Result r;
  r.rc = test::run_command(cmd, &r.out);
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every setting that names a flag in the settings table is accepted by some command: a flag in
// the table (and in docs/settings.md) that no command takes, or a setting nothing reads, is the
// "accepted but does nothing" bug. The command list comes from `backprop --help`.
TEST(CliSettings, EveryFlagInTheTableIsAcceptedBySomeCommand) {
  Result top = backprop("--help");
  ASSERT_EQ(top.rc, 0) << top.out;
  std::string helps = top.out;
  const size_t sub = top.out.find("Subcommands:");
  ASSERT_NE(sub, std::string::npos) << top.out;
  std::istringstream lines(top.out.substr(sub));
  std::string line;
  int commands = 0;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    if (line.rfind("  ", 0) != 0 || !(words >> name)) continue;
    Result h = backprop(name + " --help");
    ASSERT_EQ(h.rc, 0) << name << ": " << h.out;
    helps += h.out;
    ++commands;
    // A command with subcommands of its own (`data report`, `data split`): their flags too.
    const size_t nested = h.out.find("Subcommands:");
    if (nested == std::string::npos) continue;
    std::istringstream nested_lines(h.out.substr(nested));
    for (std::string nl; std::getline(nested_lines, nl);) {
      std::istringstream nw(nl);
      std::string child;
      if (nl.rfind("  ", 0) != 0 || !(nw >> child)) continue;
      Result ch = backprop(name + " " + child + " --help");
      ASSERT_EQ(ch.rc, 0) << name << " " << child << ": " << ch.out;
      helps += ch.out;
    }
  }
  EXPECT_GE(commands, 7);
  // Test aids have hidden flags: they must be in the generated Testing section of the docs instead.
  const std::string docs = settings_markdown();
  const size_t testing_section = docs.find("\n## Testing\n");
  ASSERT_NE(testing_section, std::string::npos);
  for (const SettingSpec& spec : settings_registry()) {
    if (!spec.flag[0]) continue;
    const std::string flag = spec.flag;
    if (is_testing_setting(spec)) {
      EXPECT_NE(docs.find("`" + flag + "`", testing_section), std::string::npos)
          << spec.key << " is a testing setting whose flag " << flag << " is not in the Testing section of the docs";
      continue;
    }
    const bool found = helps.find("  " + flag + " ") != std::string::npos ||
                       helps.find("  " + flag + ",") != std::string::npos ||
                       helps.find("  " + flag + "\n") != std::string::npos;
    EXPECT_TRUE(found) << spec.key << " has the flag " << flag << " but no command accepts it";
  }
}

TEST(CliInfo, TextReportsBuildMachineGpuAndFeatures) {
  Result r = backprop("info");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* s :
       {"backprop 0.1.0", "BLAS:", "CUDA:", "CPU:", "cores:", "RAM:", "Features:", "cuda_backend", "gpu_training"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // either GPUs are listed or the plain no-GPU line is there
  bool gpu_line = r.out.find("GPU 0:") != std::string::npos;
  bool no_gpu = r.out.find("no GPU found: training runs on the CPU") != std::string::npos;
  EXPECT_TRUE(gpu_line != no_gpu) << r.out;
}

// On a cgroup v1 host `info` shows the container's memory limit and where it was read (a fake
// /proc and /sys tree through monitor.system_root), in text and JSON; with no limit it says so.
TEST(CliInfo, ShowsTheCgroupV1MemoryLimitAndItsSource) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(64ull << 30, 32ull << 30);
  fake.own_cgroup_v1("/docker/abc");
  fake.cgroup_v1_memory("", 9223372036854771712ull, 5ull << 30);
  fake.cgroup_v1_memory("/docker", 9223372036854771712ull, 3ull << 30);
  fake.cgroup_v1_memory("/docker/abc", 3ull << 30, 1ull << 30);
  const std::string env = "BACKPROPAGATE_MONITOR__SYSTEM_ROOT=" + tmp.path;
  const std::string dir = tmp.path + "/sys/fs/cgroup/memory/docker/abc";
  Result text = backprop("info", env);
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("memory limit: 3.00 GiB (cgroup v1 " + dir + "/memory.limit_in_bytes, 1.00 GiB in use)"),
            std::string::npos)
      << text.out;
  Result js = backprop("info --json", env, true);
  ASSERT_EQ(js.rc, 0) << js.out;
  const auto limit = nlohmann::json::parse(js.out)["memory"]["limit"];
  EXPECT_EQ(limit["cgroup_version"], 1);
  EXPECT_EQ(limit["bytes_max"], 3ull << 30);
  EXPECT_EQ(limit["file"], "memory.limit_in_bytes");
  fake.cgroup_v1_memory("/docker/abc", 9223372036854771712ull, 1ull << 30);
  Result none = backprop("info", env);
  EXPECT_NE(none.out.find("memory limit: no limit (cgroup v1 " + dir + ")"), std::string::npos) << none.out;
}

TEST(CliInfo, JsonIsMachineReadable) {
  for (std::string args : {"info --json", "--json info"}) {
    Result r = backprop(args, "", true);
    ASSERT_EQ(r.rc, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["version"], "0.1.0");
    EXPECT_TRUE(j["build"]["blas_threads"].get<int>() >= 1);
    EXPECT_TRUE(j["build"].contains("cuda_compiled"));
    // A CUDA build says what the device computes in (backend/cuda/compute_precision.h): bf16 inputs,
    // or f16 ones on a compute capability 7.5 card.
    if (j["build"]["cuda_compiled"].get<bool>())
      EXPECT_NE(j["cuda"]["compute"].get<std::string>().find("16 inputs"), std::string::npos);
    else
      EXPECT_EQ(j["cuda"]["compute"], "");
    EXPECT_TRUE(j["cpu"]["logical_cores"].get<int>() >= 1);
    EXPECT_TRUE(j["memory"]["bytes_total"].get<uint64_t>() > 0);
    EXPECT_TRUE(j["gpus"].is_array());
    EXPECT_TRUE(j["cuda"].contains("driver_version"));
    EXPECT_GE(j["features"].size(), 4u);
  }
}

// runtime.cpu_kernels: detected by default, forced by the flag or the variable, and `info` says
// which variant runs and why.
TEST(CliInfo, NamesTheCpuKernelVariantAndWhy) {
  Result r = backprop("info --json", "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out)["cpu_kernels"];
  const auto supported = j["supported"].get<std::vector<std::string>>();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), "generic");
  EXPECT_EQ(j["variant"], supported.back());  // auto: the widest this CPU runs
  EXPECT_EQ(j["reason"].get<std::string>().rfind("detected:", 0), 0u) << j;
  for (const std::string& v : supported) {
    for (const auto& [args, env] : {std::pair<std::string, std::string>{"info --json --cpu-kernels " + v, ""},
                                    {"info --json", "BACKPROPAGATE_RUNTIME__CPU_KERNELS=" + v}}) {
      Result f = backprop(args, env, true);
      ASSERT_EQ(f.rc, 0) << args << " " << env << "\n" << f.out;
      auto k = nlohmann::json::parse(f.out)["cpu_kernels"];
      EXPECT_EQ(k["variant"], v) << args << " " << env;
      EXPECT_EQ(k["reason"], "forced by runtime.cpu_kernels");
    }
  }
  Result text = backprop("info --cpu-kernels generic");
  EXPECT_NE(text.out.find("CPU kernels: generic (forced by runtime.cpu_kernels)"), std::string::npos) << text.out;
  Result bad = backprop("info --cpu-kernels neon");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("CONFIG_INVALID_SETTING"), std::string::npos) << bad.out;
  // A variant this CPU lacks (only testable where one is missing) stops with its own code.
  for (const std::string v : {"avx2", "avx512"})
    if (std::find(supported.begin(), supported.end(), v) == supported.end()) {
      Result lacks = backprop("info --cpu-kernels " + v);
      EXPECT_NE(lacks.rc, 0);
      EXPECT_NE(lacks.out.find("DEP_CPU_KERNELS_UNSUPPORTED"), std::string::npos) << lacks.out;
    }
}

// runtime.cpu_gemm: `info` names the path of the GEMMs against bf16-held weights and why, whether
// oneDNN is linked, and what every GEMM kind computes in; the flag and the variable choose it; onednn
// without oneDNN is DEP_CPU_GEMM_UNAVAILABLE, an unknown engine CONFIG_INVALID_SETTING.
TEST(CliInfo, NamesTheCpuGemmEngineOfEachGemmKind) {
  Result r = backprop("info --json", "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out)["cpu_gemm"];
  EXPECT_EQ(j["setting"], "auto");
  const bool onednn = j["onednn"].get<bool>();
  EXPECT_EQ(onednn, !j["onednn_version"].get<std::string>().empty());
  const std::string held = j["held_bf16"];
  EXPECT_TRUE(held == "bf16-onednn" || held == "bf16-openblas") << held;
  EXPECT_TRUE(onednn || held == "bf16-openblas") << held;
  EXPECT_EQ(j["reason"].get<std::string>().rfind("auto:", 0), 0u) << j;
  EXPECT_NE(j["compute"].get<std::string>().find("every other GEMM"), std::string::npos) << j;
  for (const auto& [args, env] : {std::pair<std::string, std::string>{"info --json --cpu-gemm openblas", ""},
                                  {"info --json", "BACKPROPAGATE_RUNTIME__CPU_GEMM=openblas"}}) {
    Result f = backprop(args, env, true);
    ASSERT_EQ(f.rc, 0) << args << " " << env << "\n" << f.out;
    auto k = nlohmann::json::parse(f.out)["cpu_gemm"];
    EXPECT_EQ(k["setting"], "openblas");
    EXPECT_EQ(k["held_bf16"], "f32-openblas");
  }
  Result text = backprop("info --cpu-gemm openblas");
  EXPECT_NE(text.out.find("CPU GEMMs: runtime.cpu_gemm = openblas; against bf16-held weights f32-openblas"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("CPU compute: GEMMs against weights held in bf16"), std::string::npos) << text.out;
  Result forced = backprop("info --cpu-gemm onednn");
  if (onednn) {
    // Linked: it runs where oneDNN can make a bf16 matmul (AVX-512), else the same code says so.
    EXPECT_TRUE(forced.rc == 0 || forced.out.find("DEP_CPU_GEMM_UNAVAILABLE") != std::string::npos) << forced.out;
  } else {
    EXPECT_NE(forced.rc, 0);
    EXPECT_NE(forced.out.find("DEP_CPU_GEMM_UNAVAILABLE"), std::string::npos) << forced.out;
  }
  Result bad = backprop("info --cpu-gemm mkl");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("CONFIG_INVALID_SETTING"), std::string::npos) << bad.out;
}

// With OPENBLAS_CORETYPE unset, the binary either keeps OpenBLAS's own pick or names a core type,
// and `info` reports which, and the kernels OpenBLAS then runs. A user's value is left alone.
TEST(CliInfo, OpenblasCoreTypeIsReportedWithWhoChoseIt) {
  Result r = backprop("info --openblas-coretype", "-u OPENBLAS_CORETYPE", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string core = r.out.substr(0, r.out.find('\n'));
  EXPECT_TRUE(core.empty() || core == "SkylakeX" || core == "Zen" || core == "Haswell") << core;
  Result j = backprop("info --json", "-u OPENBLAS_CORETYPE", true);
  ASSERT_EQ(j.rc, 0) << j.out;
  auto b = nlohmann::json::parse(j.out)["build"];
  const std::string why = b["blas_core_why"];
  if (core.empty()) {
    EXPECT_NE(why.find("OpenBLAS's own detection"), std::string::npos) << b;
  } else {
    EXPECT_EQ(b["blas_core"], core) << b;
    EXPECT_NE(why.find("set by backprop"), std::string::npos) << b;
  }
  Result user = backprop("info --json", "OPENBLAS_CORETYPE=Prescott", true);
  ASSERT_EQ(user.rc, 0) << user.out;
  auto ub = nlohmann::json::parse(user.out)["build"];
  EXPECT_EQ(ub["blas_core"], "Prescott") << ub;
  EXPECT_NE(ub["blas_core_why"].get<std::string>().find("set by the user"), std::string::npos) << ub;
}

TEST(CliInfo, EnvVarsListsEverySettingWithDefaultAndCurrentValue) {
  Result r = backprop("info --env-vars --json --log-level warn", "BACKPROPAGATE_TRAINING__LR=0.125", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), settings_registry().size());
  for (const auto& row : j) {
    const SettingSpec* spec = find_setting(row["key"].get<std::string>());
    ASSERT_NE(spec, nullptr);
    EXPECT_EQ(row["variable"], setting_env_var(*spec));
    EXPECT_EQ(row["default"], spec->default_value);
    if (row["key"] == "training.lr") {
      EXPECT_EQ(row["current"], "0.125");
      EXPECT_EQ(row["source"], "env");
    } else if (row["key"] == "logging.level") {
      EXPECT_EQ(row["current"], "warn");
      EXPECT_EQ(row["source"], "flag");
    } else {
      EXPECT_EQ(row["source"], "default");
    }
  }
  Result text = backprop("info --env-vars");
  ASSERT_EQ(text.rc, 0);
  for (const auto& spec : settings_registry())
    EXPECT_NE(text.out.find(setting_env_var(spec)), std::string::npos) << spec.key;
}

TEST(CliInfo, ErrorCodesPrintTheCatalog) {
  Result r = backprop("info --error-codes --json", "", true);
  ASSERT_EQ(r.rc, 0);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), error_catalog().size());
  EXPECT_EQ(j[0]["code"], error_catalog()[0].name);
  Result text = backprop("info --error-codes");
  for (const auto& e : error_catalog()) EXPECT_NE(text.out.find(e.name), std::string::npos) << e.name;
}

// --env-vars, --error-codes, --ops and --openblas-coretype each print one whole document: two asked
// together used to print only the first, silently; now they are refused, naming both.
TEST(CliInfo, OneListPerCall) {
  Result r = backprop("info --env-vars --error-codes");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("[ERROR] [CONFIG_INVALID] [info] --env-vars and --error-codes each print a whole list"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Suggestion: Run `backprop info --env-vars` on its own"), std::string::npos) << r.out;
  r = backprop("info --ops --error-codes --env-vars --markdown");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("--env-vars and --error-codes and --ops"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("# Ops and backends"), std::string::npos) << "nothing printed before the refusal";
}

TEST(CliDocs, ErrorsMarkdownIsUpToDate) {
  Result r = backprop("info --error-codes --markdown", "", true);
  ASSERT_EQ(r.rc, 0);
  std::string on_disk = slurp(test::source_dir() + "/docs/errors.md");
  EXPECT_TRUE(on_disk == r.out) << "docs/errors.md is stale: regenerate it with\n"
                                << "  ./build/backprop info --error-codes --markdown > docs/errors.md";
}

TEST(CliDocs, SettingsMarkdownIsUpToDate) {
  Result r = backprop("info --env-vars --markdown", "", true);
  ASSERT_EQ(r.rc, 0);
  for (const auto& spec : settings_registry())
    EXPECT_NE(r.out.find(setting_env_var(spec)), std::string::npos) << spec.key;
  std::string on_disk = slurp(test::source_dir() + "/docs/settings.md");
  EXPECT_TRUE(on_disk == r.out) << "docs/settings.md is stale: regenerate it with\n"
                                << "  ./build/backprop info --env-vars --markdown > docs/settings.md";
}

// Fault injection is a testing aid: not listed in `train --help` (docs/settings.md has it in its
// Testing section); still accepted as a flag and a setting.
TEST(CliHelp, FaultInjectionFlagsAreHiddenFromTrainHelpButStillParsed) {
  Result r = backprop("train --help");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--lr"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--fault-inject"), std::string::npos) << "a fault-inject flag is listed in train --help";
  // Still parsed: a bad value is refused by the settings table, not as an unknown flag.
  r = backprop("train --device cpu --fault-inject-nan-step notanumber");
  EXPECT_NE(r.out.find("training.fault_inject_nan_step"), std::string::npos) << r.out;
}

// docs/ops.md is generated from the dispatch tables (src/ops/kernels.inc); every kernel is listed.
TEST(CliDocs, OpsMarkdownIsUpToDate) {
  Result r = backprop("info --ops --markdown", "", true);
  ASSERT_EQ(r.rc, 0);
  for (const char* kernel : {"rms_norm_forward", "attention_backward", "adamw_step_all", "sgemm"})
    EXPECT_NE(r.out.find(std::string("`") + kernel + "`"), std::string::npos) << kernel;
  std::string on_disk = slurp(test::source_dir() + "/docs/ops.md");
  EXPECT_TRUE(on_disk == r.out) << "docs/ops.md is stale: regenerate it with\n"
                                << "  ./build/backprop info --ops --markdown > docs/ops.md";
}

TEST(CliErrors, TextFormatAndExitCodeForUserErrors) {
  Result r = backprop("info", "BACKPROPAGATE_TRAINING__LR=fast");
  EXPECT_EQ(r.rc, 1);
  size_t err = r.out.find("[ERROR] [CONFIG_INVALID_SETTING] ");
  size_t sug = r.out.find("\nSuggestion: ");
  ASSERT_NE(err, std::string::npos) << r.out;
  EXPECT_NE(sug, std::string::npos) << r.out;
  EXPECT_LT(err, sug);
  EXPECT_EQ(r.out.find("Run id:"), std::string::npos);  // no run exists for `info`
  for (const char* s : {"training.lr", "'fast'", "0 to 10"}) EXPECT_NE(r.out.find(s), std::string::npos) << s;

  Result unknown = backprop("info", "BACKPROPAGATE_TRAINING__LEARNING_RATE=1");
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_NE(unknown.out.find("BACKPROPAGATE_TRAINING__LEARNING_RATE"), std::string::npos) << unknown.out;

  Result flag = backprop("info --no-such-flag");
  EXPECT_EQ(flag.rc, 1);
  EXPECT_NE(flag.out.find("[ERROR] [CONFIG_INVALID]"), std::string::npos) << flag.out;

  EXPECT_EQ(backprop("--help").rc, 0);
  EXPECT_EQ(backprop("info --markdown").rc, 1);
}

TEST(CliErrors, JsonEnvelope) {
  Result r = backprop("--json info --log-level loud", "", true);
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["code"], "CONFIG_INVALID_SETTING");
  EXPECT_EQ(j["retryable"], "no");
  EXPECT_TRUE(j["run_id"].is_null());
  EXPECT_EQ(j["details"]["key"], "logging.level");
  EXPECT_EQ(j["details"]["value"], "loud");
  EXPECT_FALSE(j["suggestion"].get<std::string>().empty());
  EXPECT_NE(j["message"].get<std::string>().find("loud"), std::string::npos);
}

TEST(CliErrors, SecretsAreRedactedInPrintedErrors) {
  std::string token = "hf_AbCdEfGhIjKlMnOpQr";
  for (std::string json : {"", "--json "}) {
    Result r = backprop(json + "--config /nonexistent/" + token + ".toml info");
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.out.find("CONFIG_INVALID"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(token), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("hf_***"), std::string::npos) << r.out;
  }
}

TEST(CliLogs, ConsoleAndFileSinksRedactAndCarryTheRunId) {
  test::TempDir dir;
  std::string secret_dir = dir.path + "/password=Hunter22xyz";
  std::filesystem::create_directories(secret_dir);
  std::string config = secret_dir + "/c.toml";
  std::ofstream(config) << "[training]\nlr = 1e-3\n";
  std::string log_file = dir.path + "/log.jsonl";
  Result r = backprop("--config '" + config + "' --log-level debug --log-file " + log_file + " info --env-vars");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::string file = slurp(log_file);
  for (const std::string& text : {r.out, file}) {
    EXPECT_EQ(text.find("Hunter22xyz"), std::string::npos) << text;
    EXPECT_NE(text.find("password=***"), std::string::npos) << text;
  }
  std::istringstream lines(file);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto rec = nlohmann::json::parse(line);
    EXPECT_EQ(rec["run_id"].get<std::string>().size(), 36u);
    ++n;
  }
  EXPECT_GE(n, 1);
  // --log-format json: the console lines are JSON records too
  Result j = backprop("--log-level debug --log-format json info --error-codes --json", "", false);
  ASSERT_EQ(j.rc, 0);
  EXPECT_NE(j.out.find("\"run_id\":"), std::string::npos) << j.out.substr(0, 400);
}

TEST(Repo, CodeIsClangFormatted) {
  std::string files;
  for (const char* top : {"src", "tests", "bench", "cmake"}) {
    std::filesystem::path root = std::filesystem::path(test::source_dir()) / top;
    if (!std::filesystem::exists(root)) continue;
    for (auto it = std::filesystem::recursive_directory_iterator(root); it != decltype(it)(); ++it) {
      if (it->is_directory() && it->path().filename() == "node_modules") {
        it.disable_recursion_pending();
        continue;
      }
      std::string ext = it->path().extension().string();
      if (it->is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh"))
        files += " '" + it->path().string() + "'";
    }
  }
  ASSERT_FALSE(files.empty());
  std::string out;
  int rc = test::run_command("clang-format-14 --version", &out);
  ASSERT_EQ(rc, 0) << "clang-format-14 is missing (scripts/setup.sh installs it): " << out;
  rc = test::run_command("clang-format-14 --style=file --dry-run -Werror" + files, &out);
  EXPECT_EQ(rc, 0) << "unformatted code; fix with clang-format-14 -i on the files named:\n" << out.substr(0, 4000);
}

TEST(Repo, CiRunsTheReadmeTestCommandVerbatim) {
  std::string readme = slurp(test::source_dir() + "/README.md");
  std::string ci = slurp(test::source_dir() + "/.ci/run");
  const std::string marker = "<!-- test-command -->";
  size_t m = readme.find(marker);
  ASSERT_NE(m, std::string::npos) << "README.md lost its " << marker << " marker";
  size_t start = readme.find("```sh\n", m);
  ASSERT_NE(start, std::string::npos);
  start += 6;
  std::string command = readme.substr(start, readme.find('\n', start) - start);
  EXPECT_FALSE(command.empty());
  EXPECT_NE(ci.find("\n" + command + "\n"), std::string::npos) << ".ci/run must run `" << command << "` verbatim";
}

}  // namespace
}  // namespace bp
