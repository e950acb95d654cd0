// Python's Jinja2, set up as transformers' apply_chat_template sets it up, as an oracle for the
// C++ Jinja interpreter (tests/oracles/render_jinja2.py, Debian's python3-jinja2 run with
// /usr/bin/python3; scripts/setup.sh --test installs it). A missing oracle makes the caller FAIL.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_util.h"
#include "text/jinja_eval.h"

namespace bp::test {

// cases: [{"template": ..., "context": {...}}, ...]. Returns, per case, {"ok": true, "text": ...}
// or {"ok": false, "error": ...}; [] (and a test failure) when the oracle cannot run.
inline nlohmann::ordered_json render_with_jinja2(const nlohmann::ordered_json& cases, int64_t now_epoch_s = -1) {
  TempDir dir;
  const std::string req = dir.path + "/request.json";
  nlohmann::ordered_json request{{"cases", cases}};
  if (now_epoch_s >= 0) request["now_epoch_s"] = now_epoch_s;
  std::ofstream(req, std::ios::binary) << request.dump();
  std::string out;
  const int rc =
      run_command("/usr/bin/python3 '" + source_dir() + "/tests/oracles/render_jinja2.py' '" + req + "' 2>&1", &out);
  if (rc != 0) {
    ADD_FAILURE() << "Jinja2 oracle failed (needs /usr/bin/python3 with python3-jinja2). Exit code " << rc
                  << ", output:\n"
                  << out;
    return nlohmann::ordered_json::array();
  }
  return nlohmann::ordered_json::parse(out);
}

// Our render of one case: {"ok": true, "text": ...} or {"ok": false, "error": ...} (JinjaError
// of any kind: the template cannot be rendered with this context).
inline nlohmann::ordered_json render_with_ours(const std::string& source, const nlohmann::ordered_json& context,
                                               int64_t now_epoch_s = 0) {
  try {
    return {{"ok", true}, {"text", jinja::Template(source).render_json(context, now_epoch_s)}};
  } catch (const jinja::JinjaError& e) {
    return {{"ok", false}, {"error", e.what()}};
  }
}

}  // namespace bp::test
