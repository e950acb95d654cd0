// Evaluator of the Jinja subset: renders a parsed template with a context.
//
// Semantics follow Python Jinja2 as transformers uses it (trim_blocks, lstrip_blocks,
// raise_exception, strftime_now), checked against @huggingface/jinja on real chat templates.
// Globals: true/false/none (and True/False/None), range, namespace, raise_exception,
// strftime_now. Filters and tests are listed in jinja_builtins.cpp; an unknown filter, test or
// method throws JinjaError(Unsupported) naming it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_parser.h"
#include "text/jinja_value.h"

namespace bp::jinja {

struct RenderedText {
  std::string text;
  // [begin, end) byte ranges of text rendered inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class Template {
 public:
  // Parses once; throws JinjaError (Syntax / Unsupported).
  explicit Template(const std::string& source);
  // context: an object whose keys become variables. now_epoch_s (>= 0) fixes the clock of
  // strftime_now (local time) for reproducible output; -1 uses the real clock. Past `limits`
  // the render throws JinjaError(Budget).
  std::string render(const Value& context, int64_t now_epoch_s = -1, const RenderLimits& limits = {}) const;
  std::string render_json(const nlohmann::ordered_json& context, int64_t now_epoch_s = -1,
                          const RenderLimits& limits = {}) const;
  // render() plus where {% generation %} blocks put their text (the assistant-only loss mask of
  // templates written for fine-tuning).
  RenderedText render_with_spans(const Value& context, int64_t now_epoch_s = -1, const RenderLimits& limits = {}) const;
  bool has_generation_blocks() const;

 private:
  Body body_;
};

// Built-in filters, tests and methods (jinja_builtins.cpp), used by the evaluator.
Value apply_filter(const std::string& name, const Value& operand, CallArgs& args);
bool apply_test(const std::string& name, const Value& operand, CallArgs& args);
// operand.name(...) for strings, dicts and lists; Undefined when `name` is no method of operand.
Value method_value(const Value& operand, const std::string& name);
Value strftime_value(int64_t now_epoch_s);
// The code points of a UTF-8 string, each as its bytes (string indexing, slicing, reversal and
// iteration work on characters, as in Python and JavaScript).
std::vector<std::string> code_points(const std::string& s);

}  // namespace bp::jinja
