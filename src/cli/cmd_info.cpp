// `backprop info`: version, build, machine, GPUs and the feature matrix (--json for programs);
// `--env-vars` lists every setting with its variable, default and current value; `--error-codes`
// prints the error catalog; with `--markdown` they print docs/settings.md and docs/errors.md, which
// are generated this way; `--ops` prints which backend has each kernel (docs/ops.md with --markdown).
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "core/error_report.h"
#include "core/settings.h"
#include "core/sysinfo.h"
#include "core/system_readings.h"
#include "ops/cpu_kernels.h"
#include "ops/op_table.h"

namespace {

struct InfoOptions {
  bool env_vars = false;
  bool error_codes = false;
  bool markdown = false;
  bool ops = false;
  bool openblas_coretype = false;
};

void print_env_vars(bool json) {
  const auto& s = bp::cli::settings();
  nlohmann::json arr = nlohmann::json::array();
  std::string section;
  for (const auto& spec : bp::settings_registry()) {
    std::string def = spec.default_value;
    std::string cur = s.text(spec.key);
    if (json) {
      arr.push_back({{"variable", bp::setting_env_var(spec)},
                     {"key", spec.key},
                     {"type", bp::setting_type_name(spec.type)},
                     {"default", def},
                     {"current", cur},
                     {"source", bp::setting_source_name(s.source(spec.key))},
                     {"allowed", bp::setting_allowed_text(spec)},
                     {"flag", spec.flag},
                     {"secret", spec.secret},
                     {"help", spec.help}});
      continue;
    }
    std::string sec = std::string(spec.key).substr(0, std::string(spec.key).find('.'));
    if (sec != section) {
      section = sec;
      std::cout << (section == "model" ? "" : "\n") << "[" << section << "]\n";
    }
    std::cout << fmt::format("{}  ({}{}{})\n", bp::setting_env_var(spec), bp::setting_type_name(spec.type),
                             spec.flag[0] ? ", flag " : "", spec.flag);
    std::cout << fmt::format("    default: {}   current: {} ({})\n", def.empty() ? "\"\"" : def,
                             cur.empty() ? "\"\"" : cur, bp::setting_source_name(s.source(spec.key)));
    std::cout << fmt::format("    allowed: {}\n    {}\n", bp::setting_allowed_text(spec), spec.help);
  }
  if (json) std::cout << arr.dump(2) << std::endl;
}

void print_ops(bool json, bool markdown) {
  if (markdown) {
    std::cout << bp::ops::kernel_support_markdown();
    return;
  }
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : bp::ops::kernel_support_table()) {
    if (json)
      arr.push_back({{"op", r.op}, {"kernel", r.kernel}, {"cpu", r.cpu}, {"cuda", r.cuda}});
    else
      std::cout << fmt::format("{:<14} {:<34} cpu:{:<4} cuda:{}\n", r.op, r.kernel, r.cpu ? "yes" : "no",
                               r.cuda ? "yes" : "no");
  }
  if (json) std::cout << arr.dump(2) << std::endl;
}

void print_error_codes(bool json, bool markdown) {
  if (markdown) {
    std::cout << bp::error_catalog_markdown();
    return;
  }
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& e : bp::error_catalog()) {
    if (json) {
      arr.push_back({{"code", e.name},
                     {"category", e.category},
                     {"retryable", bp::retryable_name(e.retryable)},
                     {"exit_code", bp::exit_code_for(e.code)},
                     {"trigger", e.trigger},
                     {"suggestion", e.suggestion}});
      continue;
    }
    std::cout << fmt::format("{}  ({}, retryable: {}, exit code {})\n    {}\n    Suggestion: {}\n", e.name, e.category,
                             bp::retryable_name(e.retryable), bp::exit_code_for(e.code), e.trigger, e.suggestion);
  }
  if (json) std::cout << arr.dump(2) << std::endl;
}

bp::cli::RunFn setup_info(CLI::App& sub) {
  auto o = std::make_shared<InfoOptions>();
  sub.add_flag("--env-vars", o->env_vars, "List every setting: variable, flag, type, default, current value");
  sub.add_flag("--error-codes", o->error_codes, "Print the error catalog");
  sub.add_flag("--ops", o->ops, "List the kernels of the ops and which backend (cpu, cuda) has each");
  sub.add_flag("--markdown", o->markdown,
               "With --error-codes, --env-vars or --ops: print Markdown (docs/errors.md, docs/settings.md, "
               "docs/ops.md)");
  sub.add_flag("--openblas-coretype", o->openblas_coretype,
               "Print the OPENBLAS_CORETYPE backprop runs with (its choice when unset; empty: OpenBLAS's own); for "
               "scripts");
  return [o] {
    bool json = bp::cli::global_options().json;
    if (o->markdown && !o->error_codes && !o->env_vars && !o->ops)
      throw bp::Error(bp::ErrorCode::CONFIG_INVALID,
                      "[info] --markdown only applies to --error-codes, --env-vars and --ops");
    // Each of these prints one whole document (its --json array, its docs/*.md page): two asked
    // together used to print only the first, silently.
    std::vector<std::string> asked;
    for (const auto& [flag, on] : {std::pair<const char*, bool>{"--env-vars", o->env_vars},
                                   {"--error-codes", o->error_codes},
                                   {"--ops", o->ops},
                                   {"--openblas-coretype", o->openblas_coretype}})
      if (on) asked.emplace_back(flag);
    if (asked.size() > 1)
      throw bp::Error(bp::ErrorCode::CONFIG_INVALID,
                      fmt::format("[info] {} each print a whole list: ask for one per call", fmt::join(asked, " and ")))
          .with_suggestion(fmt::format("Run `backprop info {}` on its own, then the other{}.", asked.front(),
                                       asked.size() > 2 ? "s one at a time" : ""));
    if (o->ops) {
      print_ops(json, o->markdown);
      return 0;
    }
    if (o->env_vars && o->markdown) {
      std::cout << bp::settings_markdown();
      return 0;
    }
    if (o->env_vars) {
      print_env_vars(json);
      return 0;
    }
    if (o->error_codes) {
      print_error_codes(json, o->markdown);
      return 0;
    }
    if (o->openblas_coretype) {  // what main.cpp set (or the user had set) before starting this process
      const char* core = std::getenv("OPENBLAS_CORETYPE");
      std::cout << (core ? core : "") << std::endl;
      return 0;
    }
    bp::SystemInfo info = bp::system_info();
    // The memory limit under a fake /proc and /sys tree when one is set (monitor.system_root, as the
    // safety monitor and the dashboard read it).
    if (const std::string root = bp::cli::settings().get_string("monitor.system_root"); !root.empty())
      info.mem_limit = bp::read_memory(root);
    const bp::ops::CpuKernelInfo kc = bp::ops::cpu_kernel_info();
    info.cpu_kernels = kc.variant;
    info.cpu_kernels_reason = kc.reason;
    info.cpu_kernels_supported = kc.supported;
    const bp::ops::CpuGemmInfo gi = bp::ops::cpu_gemm_info();
    info.cpu_gemm = gi.setting;
    info.cpu_gemm_held_bf16 = gi.held_bf16;
    info.cpu_gemm_reason = gi.reason;
    info.onednn_version = gi.onednn_version;
    info.cpu_compute = bp::ops::cpu_gemm_description(true);
    if (json)
      std::cout << bp::to_json(info).dump(2) << std::endl;
    else
      std::cout << bp::to_text(info);
    return 0;
  };
}

}  // namespace

BP_REGISTER_COMMAND("info", "Version, build, hardware and available features", setup_info);
