// Runtime values of the Jinja-subset interpreter (jinja_lexer / jinja_parser / jinja_eval).
//
// A Value is undefined, none, bool, int, float, string, array, object (insertion-ordered, as
// Python dicts and @huggingface/jinja objects are), a namespace (a mutable object created by
// namespace()) or a callable. Arrays and objects are shared by pointer so `set ns.x = ...`
// mutates the namespace every scope sees. Values convert from/to nlohmann::json so a chat
// conversation can be handed to the template as-is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bp::jinja {

// Every failure of the interpreter. kind tells the chat-template layer whether the template itself
// cannot be used (Syntax / Unsupported: it uses something we do not implement; Budget: it ran past
// its step or size limit) or whether the conversation is bad (Raised: the template called
// raise_exception) or a value has the wrong type (Runtime).
class JinjaError : public std::runtime_error {
 public:
  enum class Kind { Syntax, Unsupported, Runtime, Raised, Budget };
  JinjaError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Type { Undefined, None, Bool, Int, Float, String, Array, Object, Namespace, Function };
  Type type = Type::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  // String: a Markup (|safe, |escape). Adding a plain string to it HTML-escapes the plain one, as
  // markupsafe does; `~`, join and tojson give plain strings. Ignored by comparisons.
  bool markup = false;
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;  // Object and Namespace
  std::shared_ptr<Function> fn;

  static Value undefined() { return Value{}; }
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value markup_string(std::string v);
  static Value array(Array v = {});
  static Value object(Object v = {});
  static Value ns(Object v = {});
  static Value function(Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_number() const { return type == Type::Int || type == Type::Float; }
  bool is_array() const { return type == Type::Array; }
  bool is_mapping() const { return type == Type::Object || type == Type::Namespace; }

  bool truthy() const;
  // Python's str(): what {{ value }} and |string print; a list or dict prints as Python's repr
  // ({'a': 1, 'b': [True, None]}), not as JSON.
  std::string to_output() const;
  // Python's repr(): strings quoted and escaped as Python does; how items inside a list or dict print.
  std::string repr(int depth = 0) const;
  // tojson with Python's default separators (", " and ": ") or an indent.
  std::string to_json(int indent = -1, int depth = 0) const;
  // Attribute/key lookup on objects; Undefined when absent.
  Value get(const std::string& key) const;
  // d[key] for any key value (a string or an integer key); Undefined when absent.
  Value get_item(const Value& key) const;
  void set(const std::string& key, Value v);
  const char* type_name() const;
};

bool values_equal(const Value& a, const Value& b);

// Dict keys are stored as strings: a string key as itself, an integer key ({0: 0, 512: 128}, as
// Python dicts allow) as "\xFF" + its decimal digits, which no UTF-8 string can start with. A bool
// or integral float key is its integer, as Python hashes them. nullopt for any other key type.
std::optional<std::string> dict_key(const Value& key);
// The key as the template sees it (iteration, items(), dictsort): a string or an integer.
Value key_value(const std::string& stored);

// Limits on one render (issue 13): a hostile template (nested range loops, a list or string that
// doubles itself) ends in JinjaError(Budget) instead of running for minutes or exhausting memory.
struct RenderLimits {
  int64_t max_steps = 50'000'000;  // statements, expressions and loop iterations executed
  int64_t max_bytes = 256 << 20;   // the size of any string made (the output included) or list (elements)
};
// Throws JinjaError(Budget) when n exceeds the running render's max_bytes (no-op outside a render).
void check_value_size(size_t n, const char* what);
// The limits of the render running on this thread (set by jinja::Template::render).
class ScopedRenderLimits {
 public:
  explicit ScopedRenderLimits(const RenderLimits& limits);
  ~ScopedRenderLimits();
  ScopedRenderLimits(const ScopedRenderLimits&) = delete;
  ScopedRenderLimits& operator=(const ScopedRenderLimits&) = delete;

 private:
  const RenderLimits* previous_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // positional[i], else keyword `name`, else fallback.
  Value arg(size_t index, const std::string& name, Value fallback = Value{}) const;
};

}  // namespace bp::jinja
