// Tree-walking evaluator for the Jinja subset: scopes, statements, operators, calls, macros.
#include "text/jinja_eval.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <map>

#include "text/jinja_strings.h"

namespace bp::jinja {

namespace {

[[noreturn]] void runtime_error(int line, const std::string& msg) {
  throw JinjaError(JinjaError::Kind::Runtime, fmt::format("template line {}: {}", line, msg));
}
[[noreturn]] void unsupported(int line, const std::string& msg) {
  throw JinjaError(JinjaError::Kind::Unsupported, fmt::format("template line {}: unsupported {}", line, msg));
}

// Builtins throw without a position; add the template line once.
JinjaError with_line(const JinjaError& e, int line) {
  const std::string msg = e.what();
  if (msg.rfind("template line", 0) == 0 || e.kind() == JinjaError::Kind::Raised) return e;
  return JinjaError(e.kind(), fmt::format("template line {}: {}", line, msg));
}

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Interpreter(const Value& context, int64_t now_epoch_s, const RenderLimits& limits) : limits_(limits) {
    scopes_.emplace_back();
    auto& g = scopes_.back();
    g["true"] = g["True"] = Value::boolean(true);
    g["false"] = g["False"] = Value::boolean(false);
    g["none"] = g["None"] = Value::none();
    g["raise_exception"] = Value::function(
        [](CallArgs& a) -> Value { throw JinjaError(JinjaError::Kind::Raised, a.arg(0, "message").to_output()); });
    g["range"] = Value::function([](CallArgs& a) -> Value {
      auto as_int = [](const Value& v) { return v.type == Value::Type::Int ? v.i : static_cast<int64_t>(v.f); };
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = as_int(a.positional[0]);
      } else if (a.positional.size() >= 2) {
        start = as_int(a.positional[0]);
        stop = as_int(a.positional[1]);
        if (a.positional.size() >= 3) step = as_int(a.positional[2]);
      }
      if (step == 0) throw JinjaError(JinjaError::Kind::Runtime, "range() step must not be zero");
      Array out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        out.push_back(Value::integer(k));
        if (out.size() > 10000000) throw JinjaError(JinjaError::Kind::Runtime, "range() too large");
      }
      return Value::array(std::move(out));
    });
    g["namespace"] = Value::function([](CallArgs& a) -> Value {
      Value ns = Value::ns();
      if (!a.positional.empty() && a.positional[0].is_mapping())
        for (const auto& [k, v] : *a.positional[0].obj) ns.set(k, v);
      for (const auto& [k, v] : a.keyword) ns.set(k, v);
      return ns;
    });
    g["strftime_now"] = strftime_value(now_epoch_s);
    if (context.is_mapping())
      for (const auto& [k, v] : *context.obj) g[k] = v;
  }

  std::string run(const Body& body, std::vector<std::pair<size_t, size_t>>* spans) {
    std::string out;
    root_out_ = &out;
    spans_ = spans;
    exec_body(body, out);
    return out;
  }

 private:
  std::vector<std::map<std::string, Value>> scopes_;
  int depth_ = 0;
  const RenderLimits& limits_;
  int64_t steps_ = 0;
  const std::string* root_out_ = nullptr;                    // the final output (not a capture)
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;  // generation blocks' output ranges

  void tick(int line) {
    if (++steps_ > limits_.max_steps)
      throw JinjaError(JinjaError::Kind::Budget,
                       fmt::format("template line {}: ran more than {} steps (setting data.template_max_steps)", line,
                                   limits_.max_steps));
  }
  static void append(std::string& out, const std::string& piece) {
    check_value_size(out.size() + piece.size(), "the rendered text");
    out += piece;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined();
  }
  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    tick(s.line);
    switch (s.kind) {
      case Stmt::Kind::Text: append(out, s.text); return Flow::Normal;
      case Stmt::Kind::Output: append(out, eval(*s.expr).to_output()); return Flow::Normal;
      case Stmt::Kind::If: return exec_body(eval(*s.expr).truthy() ? s.body : s.else_body, out);
      case Stmt::Kind::For: return exec_for(s, out);
      case Stmt::Kind::Set: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value target = lookup(s.text);
          if (target.type != Value::Type::Namespace)
            runtime_error(s.line, fmt::format("cannot set attribute '{}' of a {} (only namespace objects)", s.attr,
                                              target.type_name()));
          target.set(s.attr, std::move(v));
        } else if (s.targets.size() > 1) {
          if (!v.is_array() || v.arr->size() != s.targets.size())
            runtime_error(s.line, fmt::format("cannot unpack into {} names", s.targets.size()));
          for (size_t k = 0; k < s.targets.size(); ++k) assign(s.targets[k], (*v.arr)[k]);
        } else {
          assign(s.text, std::move(v));
        }
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        std::string captured;
        scopes_.emplace_back();
        exec_body(s.body, captured);
        scopes_.pop_back();
        assign(s.text, Value::string(captured));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: {
        const Stmt* macro = &s;
        assign(s.text, Value::function([this, macro](CallArgs& a) -> Value {
                 std::map<std::string, Value> frame;
                 for (size_t k = 0; k < macro->params.size(); ++k) {
                   const auto& [pname, def] = macro->params[k];
                   Value v = a.arg(k, pname);
                   if (v.is_undefined() && def) v = eval(*def);
                   frame[pname] = v;
                 }
                 scopes_.push_back(std::move(frame));
                 std::string body_out;
                 exec_body(macro->body, body_out);
                 scopes_.pop_back();
                 return Value::string(body_out);
               }));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string captured;
        scopes_.emplace_back();
        exec_body(s.body, captured);
        assign(kFilterBlockInput, Value::string(std::move(captured)));
        const Value filtered = eval(*s.expr);
        scopes_.pop_back();
        append(out, filtered.to_output());
        return Flow::Normal;
      }
      case Stmt::Kind::Generation: {
        const size_t start = out.size();
        const Flow f = exec_body(s.body, out);
        // Only text that reaches the final output is a span (not a macro's or a set block's).
        if (&out == root_out_ && spans_ && out.size() > start) spans_->emplace_back(start, out.size());
        return f;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    Value iterable = eval(*s.expr);
    Array items;
    if (iterable.is_array()) {
      items = *iterable.arr;
    } else if (iterable.is_mapping()) {
      for (const auto& [k, v] : *iterable.obj) items.push_back(key_value(k));
    } else if (iterable.is_string()) {
      for (auto& c : code_points(iterable.s)) items.push_back(Value::string(std::move(c)));
    } else if (!iterable.is_undefined()) {  // none raises, as in Jinja; undefined iterates as empty
      runtime_error(s.line, fmt::format("cannot iterate over a {}", iterable.type_name()));
    }
    scopes_.emplace_back();
    auto bind = [&](const Value& item) {
      if (s.targets.size() == 1) {
        assign(s.targets[0], item);
      } else {
        if (!item.is_array() || item.arr->size() != s.targets.size())
          runtime_error(s.line, fmt::format("cannot unpack loop item into {} names", s.targets.size()));
        for (size_t k = 0; k < s.targets.size(); ++k) assign(s.targets[k], (*item.arr)[k]);
      }
    };
    if (s.filter) {
      Array kept;
      for (const auto& item : items) {
        tick(s.line);
        bind(item);
        if (eval(*s.filter).truthy()) kept.push_back(item);
      }
      items.swap(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      tick(s.line);
      bind(items[k]);
      Value loop = Value::object();
      loop.set("index0", Value::integer(k));
      loop.set("index", Value::integer(k + 1));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("revindex", Value::integer(n - k));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined());
      loop.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined());
      assign("loop", loop);
      if (exec_body(s.body, out) == Flow::Break) break;
    }
    if (n == 0) exec_body(s.else_body, out);
    scopes_.pop_back();
    return Flow::Normal;
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    for (const auto& it : e.items) a.positional.push_back(eval(*it));
    if (e.b) {  // f(*args): a list's items as more positional arguments
      Value extra = eval(*e.b);
      if (!extra.is_array()) runtime_error(e.line, fmt::format("*args must be a list, not {}", extra.type_name()));
      a.positional.insert(a.positional.end(), extra.arr->begin(), extra.arr->end());
    }
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    if (e.c) {  // f(**kwargs): a dict's string keys as keyword arguments
      Value extra = eval(*e.c);
      if (!extra.is_mapping()) runtime_error(e.line, fmt::format("**kwargs must be a dict, not {}", extra.type_name()));
      for (const auto& [k, v] : *extra.obj) {
        if (!key_value(k).is_string()) runtime_error(e.line, "**kwargs keys must be strings");
        a.keyword.emplace_back(k, v);
      }
    }
    return a;
  }

  static int64_t to_index(const Value& v, int line) {
    if (v.type == Value::Type::Int) return v.i;
    if (v.type == Value::Type::Bool) return v.b;
    runtime_error(line, fmt::format("index must be an integer, not {}", v.type_name()));
  }

  Value eval(const Expr& e) {
    tick(e.line);
    if (++depth_ > 500) runtime_error(e.line, "expression nesting too deep");
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth_};
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::List: {
        Array a;
        for (const auto& it : e.items) a.push_back(eval(*it));
        return Value::array(std::move(a));
      }
      case Expr::Kind::Dict: {
        Value o = Value::object();
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k]);
          // Jinja keeps integer keys as integers (Seed-OSS: {0: 0, 512: 128, ...}); other key types
          // are refused rather than silently turned into strings.
          const auto stored = dict_key(key);
          if (!stored) unsupported(e.line, fmt::format("dict literal with a {} key", key.type_name()));
          o.set(*stored, eval(*e.items[k + 1]));
        }
        return o;
      }
      case Expr::Kind::Member: {
        Value obj = eval(*e.a);
        if (obj.is_undefined()) runtime_error(e.line, fmt::format("'{}' of an undefined value", e.name));
        if (obj.is_mapping()) {
          Value v = obj.get(e.name);
          if (!v.is_undefined()) return v;
        }
        return method_value(obj, e.name);
      }
      case Expr::Kind::Index: {
        Value obj = eval(*e.a);
        Value key = eval(*e.b);
        if (obj.is_undefined()) runtime_error(e.line, "subscript of an undefined value");
        return subscript(obj, key);
      }
      case Expr::Kind::Slice: return eval_slice(e);
      case Expr::Kind::Call: {
        Value callee = eval(*e.a);
        CallArgs args = eval_args(e);
        if (callee.type != Value::Type::Function) {
          std::string what =
              e.a->kind == Expr::Kind::Name || e.a->kind == Expr::Kind::Member ? e.a->name : "expression";
          if (callee.is_undefined()) unsupported(e.line, fmt::format("function or method '{}'", what));
          runtime_error(e.line, fmt::format("'{}' is a {}, not callable", what, callee.type_name()));
        }
        return (*callee.fn)(args);
      }
      case Expr::Kind::Filter: {
        Value operand = eval(*e.a);
        CallArgs args = eval_args(e);
        try {
          return apply_filter(e.name, operand, args);
        } catch (const JinjaError& err) {
          throw with_line(err, e.line);
        }
      }
      case Expr::Kind::Test: {
        Value operand = eval(*e.a);
        CallArgs args = eval_args(e);
        try {
          return Value::boolean(apply_test(e.name, operand, args) != e.negate);
        } catch (const JinjaError& err) {
          throw with_line(err, e.line);
        }
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.a);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.type == Value::Type::Int) return Value::integer(e.name == "-" ? -v.i : v.i);
        if (v.type == Value::Type::Float) return Value::number(e.name == "-" ? -v.f : v.f);
        runtime_error(e.line, fmt::format("bad operand type for unary {}: {}", e.name, v.type_name()));
      }
      case Expr::Kind::Binary: return eval_binary(e);
      case Expr::Kind::Ternary:
        if (eval(*e.c).truthy()) return eval(*e.a);
        return e.b ? eval(*e.b) : Value::undefined();
    }
    return Value::undefined();
  }

  // obj[key] as Jinja2's Environment.getitem: the item, else (a string key) the attribute or method
  // of that name, else undefined. Never an error: 'text'['type'] and none['x'] are undefined.
  static Value subscript(const Value& obj, const Value& key) {
    const bool int_key = key.type == Value::Type::Int || key.type == Value::Type::Bool;
    if (obj.is_mapping()) {
      Value v = obj.get_item(key);
      if (!v.is_undefined()) return v;
    } else if ((obj.is_array() || obj.is_string()) && int_key) {
      std::vector<std::string> chars;
      if (obj.is_string()) chars = code_points(obj.s);
      const int64_t len = obj.is_array() ? static_cast<int64_t>(obj.arr->size()) : static_cast<int64_t>(chars.size());
      int64_t idx = key.type == Value::Type::Int ? key.i : key.b;
      if (idx < 0) idx += len;
      if (idx < 0 || idx >= len) return Value::undefined();
      if (obj.is_array()) return (*obj.arr)[idx];
      Value ch = Value::string(chars[static_cast<size_t>(idx)]);
      ch.markup = obj.markup;
      return ch;
    }
    return key.is_string() ? method_value(obj, key.s) : Value::undefined();
  }

  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.a);
    std::vector<std::string> chars;  // strings slice by code point
    if (obj.is_string()) chars = code_points(obj.s);
    const int64_t len = obj.is_array()    ? static_cast<int64_t>(obj.arr->size())
                        : obj.is_string() ? static_cast<int64_t>(chars.size())
                                          : -1;
    if (len < 0) runtime_error(e.line, fmt::format("cannot slice a {}", obj.type_name()));
    int64_t step = 1;
    if (!e.items.empty() && e.items[0]) step = to_index(eval(*e.items[0]), e.line);
    if (step == 0) runtime_error(e.line, "slice step cannot be zero");
    auto clamp = [&](const ExprPtr& x, int64_t dflt) {
      if (!x) return dflt;
      int64_t v = to_index(eval(*x), e.line);
      if (v < 0) v += len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t start = clamp(e.b, step > 0 ? 0 : len - 1);
    const int64_t stop = clamp(e.c, step > 0 ? len : -1);
    Array out;
    std::string sout;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (obj.is_array())
        out.push_back((*obj.arr)[k]);
      else
        sout += chars[static_cast<size_t>(k)];
    }
    if (obj.is_array()) return Value::array(std::move(out));
    Value sliced = Value::string(sout);
    sliced.markup = obj.markup;
    return sliced;
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.a);
      return l.truthy() ? eval(*e.b) : l;
    }
    if (op == "or") {
      Value l = eval(*e.a);
      return l.truthy() ? l : eval(*e.b);
    }
    Value l = eval(*e.a), r = eval(*e.b);
    using T = Value::Type;
    if (op == "==") return Value::boolean(values_equal(l, r));
    if (op == "!=") return Value::boolean(!values_equal(l, r));
    if (op == "~") {
      // Sizes first: a string that doubles itself must stop at the budget, not after building the copy.
      if (l.is_string() && r.is_string()) check_value_size(l.s.size() + r.s.size(), "a string");
      std::string ls = l.to_output(), rs = r.to_output();
      check_value_size(ls.size() + rs.size(), "a string");
      return Value::string(ls + rs);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string() && l.is_string()) {
        found = r.s.find(l.s) != std::string::npos;
      } else if (r.is_array()) {
        for (const auto& x : *r.arr) found = found || values_equal(x, l);
      } else if (r.is_mapping()) {
        found = !r.get_item(l).is_undefined();
      } else if (!r.is_undefined()) {  // Python: `x in None` raises (Qwen3, gpt-oss test content with `in`)
        runtime_error(e.line, fmt::format("'in' needs a string, list or dict on the right, not {}", r.type_name()));
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    const bool nums = (l.is_number() || l.type == T::Bool) && (r.is_number() || r.type == T::Bool);
    auto d = [](const Value& v) {
      return v.type == T::Int ? static_cast<double>(v.i) : v.type == T::Bool ? double(v.b) : v.f;
    };
    const bool ints = nums && l.type != T::Float && r.type != T::Float;
    auto iv = [](const Value& v) { return v.type == T::Int ? v.i : static_cast<int64_t>(v.b); };
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (nums)
        cmp = d(l) < d(r) ? -1 : d(l) > d(r) ? 1 : 0;
      else if (l.is_string() && r.is_string())
        cmp = l.s.compare(r.s) < 0 ? -1 : l.s == r.s ? 0 : 1;
      else
        runtime_error(e.line, fmt::format("cannot compare {} with {}", l.type_name(), r.type_name()));
      bool res = op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0;
      return Value::boolean(res);
    }
    if (op == "+") {
      if (nums) return ints ? Value::integer(iv(l) + iv(r)) : Value::number(d(l) + d(r));
      if (l.is_array() && r.is_array()) {
        check_value_size(l.arr->size() + r.arr->size(), "a list");
        Array a = *l.arr;
        a.insert(a.end(), r.arr->begin(), r.arr->end());
        return Value::array(std::move(a));
      }
      // As Python: only a string adds to a string ('a' + 1, 'a' + none and 'a' + a list raise, where
      // @huggingface/jinja concatenates or prints "[object Map]").
      if (l.is_string() && r.is_string()) {
        check_value_size(l.s.size() + r.s.size(), "a string");
        if (!l.markup && !r.markup) return Value::string(l.s + r.s);
        // Markup + str escapes the plain side (markupsafe): '<b>'|safe + '<i>' is "<b>&lt;i&gt;".
        return Value::markup_string((l.markup ? l.s : html_escape(l.s)) + (r.markup ? r.s : html_escape(r.s)));
      }
      runtime_error(e.line, fmt::format("cannot add {} and {}", l.type_name(), r.type_name()));
    }
    if (op == "*" && (l.is_string() || r.is_string())) {
      const Value& str = l.is_string() ? l : r;
      const Value& cnt = l.is_string() ? r : l;
      if (cnt.type != T::Int) runtime_error(e.line, "a string can only be multiplied by an integer");
      std::string out;
      if (cnt.i > 0 && !str.s.empty()) {  // the size without overflow: a long string times a huge count
        const auto n = static_cast<uint64_t>(cnt.i);
        check_value_size(n > (uint64_t{1} << 62) / str.s.size() ? SIZE_MAX : str.s.size() * n, "a string");
      }
      for (int64_t k = 0; k < cnt.i && !str.s.empty(); ++k) out += str.s;
      Value repeated = Value::string(out);
      repeated.markup = str.markup;
      return repeated;
    }
    if (!nums) {
      if (op == "%" && l.is_string()) unsupported(e.line, "string formatting with '%'");
      runtime_error(e.line,
                    fmt::format("unsupported operand types for {}: {} and {}", op, l.type_name(), r.type_name()));
    }
    if (op == "-") return ints ? Value::integer(iv(l) - iv(r)) : Value::number(d(l) - d(r));
    if (op == "*") return ints ? Value::integer(iv(l) * iv(r)) : Value::number(d(l) * d(r));
    if (op == "/") {
      if (d(r) == 0) runtime_error(e.line, "division by zero");
      return Value::number(d(l) / d(r));
    }
    if (op == "//" || op == "%") {
      if (d(r) == 0) runtime_error(e.line, "division by zero");
      if (ints) {
        int64_t a = iv(l), b = iv(r), q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --q;  // floor division, as Python
        return op == "//" ? Value::integer(q) : Value::integer(a - q * b);
      }
      double q = std::floor(d(l) / d(r));
      return op == "//" ? Value::number(q) : Value::number(d(l) - q * d(r));
    }
    if (op == "**")
      return ints && iv(r) >= 0 ? Value::integer(static_cast<int64_t>(std::pow(d(l), d(r))))
                                : Value::number(std::pow(d(l), d(r)));
    unsupported(e.line, fmt::format("operator '{}'", op));
  }
};

}  // namespace

Template::Template(const std::string& source) : body_(parse_template(source)) {}

std::string Template::render(const Value& context, int64_t now_epoch_s, const RenderLimits& limits) const {
  ScopedRenderLimits scoped(limits);
  Interpreter in(context, now_epoch_s, limits);
  return in.run(body_, nullptr);
}

RenderedText Template::render_with_spans(const Value& context, int64_t now_epoch_s, const RenderLimits& limits) const {
  ScopedRenderLimits scoped(limits);
  Interpreter in(context, now_epoch_s, limits);
  RenderedText r;
  r.text = in.run(body_, &r.generation_spans);
  return r;
}

namespace {
bool body_has_generation(const Body& body) {
  for (const auto& s : body)
    if (s->kind == Stmt::Kind::Generation || body_has_generation(s->body) || body_has_generation(s->else_body))
      return true;
  return false;
}
}  // namespace

bool Template::has_generation_blocks() const {
  return body_has_generation(body_);
}

std::string Template::render_json(const nlohmann::ordered_json& context, int64_t now_epoch_s,
                                  const RenderLimits& limits) const {
  return render(Value::from_json(context), now_epoch_s, limits);
}

}  // namespace bp::jinja
