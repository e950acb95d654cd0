// Built-in filters, tests and methods of the Jinja subset, with Python/Jinja2 semantics.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>

#include "text/jinja_eval.h"
#include "text/jinja_strings.h"
#include "text/unicode.h"

namespace bp::jinja {

namespace {

[[noreturn]] void unsupported(const std::string& what) {
  throw JinjaError(JinjaError::Kind::Unsupported, "unsupported " + what);
}
[[noreturn]] void type_error(const std::string& msg) {
  throw JinjaError(JinjaError::Kind::Runtime, msg);
}

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  if (!chars.is_string()) return py_strip(s, left, right);
  return py_strip_chars(s, chars.s, left, right);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    for (size_t k = 0; k < s.size(); ++k) {
      if (count < 0 || static_cast<int64_t>(k) < count) out += to;
      out += s[k];
      check_value_size(out.size(), "replace output");
    }
    if (count < 0 || static_cast<int64_t>(s.size()) < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  for (;;) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos || (count >= 0 && done >= count)) break;
    out += s.substr(pos, f - pos) + to;
    check_value_size(out.size(), "replace output");
    pos = f + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array parts;
  if (sep.is_undefined() || sep.is_none()) {  // split on runs of (Python's Unicode) whitespace
    for (auto& part : py_split_whitespace(s, maxsplit)) parts.push_back(Value::string(std::move(part)));
    return Value::array(std::move(parts));
  }
  if (!sep.is_string() || sep.s.empty()) type_error("split() separator must be a non-empty string");
  size_t pos = 0;
  for (;;) {
    size_t f = s.find(sep.s, pos);
    if (f == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)) break;
    parts.push_back(Value::string(s.substr(pos, f - pos)));
    pos = f + sep.s.size();
  }
  parts.push_back(Value::string(s.substr(pos)));
  return Value::array(std::move(parts));
}

bool affix_match(const std::string& s, const Value& pat, bool prefix) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return prefix ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (pat.is_string()) return one(pat.s);
  if (pat.is_array()) {
    for (const auto& p : *pat.arr)
      if (p.is_string() && one(p.s)) return true;
    return false;
  }
  type_error(fmt::format("{}() argument must be a string or tuple", prefix ? "startswith" : "endswith"));
}

Value items_of(const Value& v) {
  Array out;
  for (const auto& [k, x] : *v.obj) out.push_back(Value::array({key_value(k), x}));
  return Value::array(std::move(out));
}

Array as_list(const Value& v) {
  if (v.is_array()) return *v.arr;
  Array out;
  if (v.is_string())
    for (auto& c : code_points(v.s)) out.push_back(Value::string(std::move(c)));
  else if (v.is_mapping())
    for (const auto& [k, x] : *v.obj) out.push_back(key_value(k));
  else if (!v.is_undefined() && !v.is_none())
    type_error(fmt::format("a {} is not iterable", v.type_name()));
  return out;
}

// attribute "a.b" of an item (selectattr/map/sort).
Value attribute_of(const Value& item, const std::string& path) {
  Value cur = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_mapping())
      cur = cur.get(part);
    else
      return Value::undefined();
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

int64_t length_of(const Value& v) {
  if (v.is_string()) {  // characters, not bytes (UTF-8 continuation bytes are not counted)
    int64_t n = 0;
    for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;
    return n;
  }
  if (v.is_array()) return static_cast<int64_t>(v.arr->size());
  if (v.is_mapping()) return static_cast<int64_t>(v.obj->size());
  if (v.is_undefined()) return 0;
  type_error(fmt::format("object of type {} has no length", v.type_name()));
}

Value select_items(const Value& operand, CallArgs& args, bool by_attr, bool keep) {
  Array out;
  for (const auto& item : as_list(operand)) {
    Value subject = item;
    size_t first_test_arg = 0;
    if (by_attr) {
      subject = attribute_of(item, args.arg(0, "attribute").to_output());
      first_test_arg = 1;
    }
    bool ok;
    if (args.positional.size() <= first_test_arg) {
      ok = subject.truthy();
    } else {
      CallArgs test_args;
      std::string test = args.positional[first_test_arg].to_output();
      for (size_t k = first_test_arg + 1; k < args.positional.size(); ++k)
        test_args.positional.push_back(args.positional[k]);
      ok = apply_test(test, subject, test_args);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::array(std::move(out));
}

// Python's < for the values sort and dictsort compare: numbers by value, strings by code point
// (lowercased first unless case_sensitive); anything else (or a mix) raises, as in Python.
bool sort_less(const Value& l, const Value& r, bool case_sensitive) {
  const bool ln = l.is_number() || l.type == Value::Type::Bool, rn = r.is_number() || r.type == Value::Type::Bool;
  auto num = [](const Value& v) {
    return v.type == Value::Type::Int ? static_cast<double>(v.i) : v.type == Value::Type::Bool ? v.b : v.f;
  };
  if (ln && rn) return num(l) < num(r);
  if (l.is_string() && r.is_string())
    return case_sensitive ? l.s < r.s : text::lowercase_unicode(l.s) < text::lowercase_unicode(r.s);
  type_error(fmt::format("'<' not supported between instances of {} and {}", l.type_name(), r.type_name()));
}

// A copy of v with every dict's keys sorted (tojson(sort_keys=true)), recursively.
Value sorted_keys(const Value& v) {
  if (v.is_array()) {
    Array out;
    for (const auto& x : *v.arr) out.push_back(sorted_keys(x));
    return Value::array(std::move(out));
  }
  if (!v.is_mapping()) return v;
  Object o;
  for (const auto& [k, x] : *v.obj) o.emplace_back(k, sorted_keys(x));
  std::stable_sort(o.begin(), o.end(), [](const auto& x, const auto& y) {
    return sort_less(key_value(x.first), key_value(y.first), true);
  });
  return Value::object(std::move(o));
}

}  // namespace

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(text::utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {
Value filter_value(const std::string& name, const Value& v, CallArgs& a);
}  // namespace

Value apply_filter(const std::string& name, const Value& v, CallArgs& a) {
  const bool markup_in = v.is_string() && v.markup;
  if (name == "safe") return markup_in ? v : Value::markup_string(v.to_output());
  if (name == "escape" || name == "e" || name == "forceescape")
    return markup_in && name != "forceescape" ? v : Value::markup_string(html_escape(v.to_output()));
  Value out = filter_value(name, v, a);
  // Filters that call a str method on their operand keep a Markup one Markup (Jinja2's soft_str).
  static const char* const kKeepMarkup[] = {"trim",       "strip",  "upper",   "lower", "title",
                                            "capitalize", "string", "reverse", "indent"};
  if (markup_in && out.is_string() &&
      std::any_of(std::begin(kKeepMarkup), std::end(kKeepMarkup), [&](const char* f) { return name == f; }))
    out.markup = true;
  return out;
}

namespace {
Value filter_value(const std::string& name, const Value& v, CallArgs& a) {
  if (name == "trim" || name == "strip") {
    Value chars = a.arg(0, "chars");
    return Value::string(strip_chars(v.to_output(), chars, true, true));
  }
  if (name == "length" || name == "count") return Value::integer(length_of(v));
  if (name == "tojson") {
    Value indent = a.arg(0, "indent");
    const bool sort_keys = a.arg(99, "sort_keys", Value::boolean(false)).truthy();
    return Value::string(
        (sort_keys ? sorted_keys(v) : v).to_json(indent.type == Value::Type::Int ? static_cast<int>(indent.i) : -1));
  }
  if (name == "upper") return Value::string(text::uppercase_unicode(v.to_output()));
  if (name == "lower") return Value::string(text::lowercase_unicode(v.to_output()));
  if (name == "title") return Value::string(jinja_title(v.to_output()));
  if (name == "capitalize") return Value::string(py_capitalize(v.to_output()));
  if (name == "replace") {
    Value count = a.arg(2, "count");
    return Value::string(replace_all(v.to_output(), a.arg(0, "old").to_output(), a.arg(1, "new").to_output(),
                                     count.type == Value::Type::Int ? count.i : -1));
  }
  if (name == "default" || name == "d") {
    const bool boolean = a.arg(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.arg(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "first" || name == "last") {
    Array l = as_list(v);
    if (l.empty()) return Value::undefined();
    return name == "first" ? l.front() : l.back();
  }
  if (name == "join") {
    std::string sep = a.arg(0, "d", Value::string("")).to_output();
    Value attr = a.arg(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& x : as_list(v)) {
      if (!first) out += sep;
      first = false;
      out += (attr.is_undefined() ? x : attribute_of(x, attr.to_output())).to_output();
      check_value_size(out.size(), "join output");
    }
    return Value::string(out);
  }
  if (name == "list") return Value::array(as_list(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::array();  // Jinja2: an undefined value has no items
    if (!v.is_mapping()) type_error(fmt::format("items filter needs a dict, not {}", v.type_name()));
    return items_of(v);
  }
  if (name == "string") return Value::string(v.to_output());
  if (name == "int") {
    if (v.type == Value::Type::Int) return v;
    if (v.type == Value::Type::Float) return Value::integer(static_cast<int64_t>(v.f));
    if (v.type == Value::Type::Bool) return Value::integer(v.b);
    try {
      return Value::integer(std::stoll(v.to_output()));
    } catch (...) {
      return a.arg(0, "default", Value::integer(0));
    }
  }
  if (name == "float") {
    if (v.type == Value::Type::Int) return Value::number(static_cast<double>(v.i));
    if (v.type == Value::Type::Float) return v;
    try {
      return Value::number(std::stod(v.to_output()));
    } catch (...) {
      return a.arg(0, "default", Value::number(0.0));
    }
  }
  if (name == "abs") {
    if (v.type == Value::Type::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.type == Value::Type::Float) return Value::number(v.f < 0 ? -v.f : v.f);
    type_error("abs needs a number");
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cps = code_points(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(out);
    }
    Array l = as_list(v);
    std::reverse(l.begin(), l.end());
    return Value::array(std::move(l));
  }
  if (name == "selectattr" || name == "rejectattr") return select_items(v, a, true, name == "selectattr");
  if (name == "select" || name == "reject") return select_items(v, a, false, name == "select");
  if (name == "map") {
    Value attr = a.arg(99, "attribute");
    Array out;
    for (const auto& x : as_list(v)) {
      if (!attr.is_undefined()) {
        Value got = attribute_of(x, attr.to_output());
        out.push_back(got.is_undefined() ? a.arg(99, "default") : got);
      } else {
        CallArgs sub;
        std::string filter = a.arg(0, "name").to_output();
        for (size_t k = 1; k < a.positional.size(); ++k) sub.positional.push_back(a.positional[k]);
        out.push_back(apply_filter(filter, x, sub));
      }
    }
    return Value::array(std::move(out));
  }
  if (name == "unique") {
    Array out;
    for (const auto& x : as_list(v)) {
      bool seen = false;
      for (const auto& y : out) seen = seen || values_equal(x, y);
      if (!seen) out.push_back(x);
    }
    return Value::array(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_mapping()) type_error("dictsort needs a dict");
    // Jinja2's dictsort: by key (or by='value'), strings compared case-insensitively unless
    // case_sensitive=true, integer keys by value; reverse=true reverses.
    const bool case_sensitive = a.arg(0, "case_sensitive", Value::boolean(false)).truthy();
    const bool by_value = a.arg(1, "by", Value::string("key")).to_output() == "value";
    const bool reverse = a.arg(2, "reverse", Value::boolean(false)).truthy();
    Array items = *items_of(v).arr;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value& l = (*x.arr)[by_value ? 1 : 0];
      const Value& r = (*y.arr)[by_value ? 1 : 0];
      return reverse ? sort_less(r, l, case_sensitive) : sort_less(l, r, case_sensitive);
    });
    return Value::array(std::move(items));
  }
  if (name == "indent") {
    int64_t width = a.arg(0, "width", Value::integer(4)).i;
    const bool first = a.arg(1, "first", Value::boolean(false)).truthy();
    const std::string pad(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
    std::string s = v.to_output(), out;
    for (size_t k = 0; k < s.size(); ++k) {
      out += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
      check_value_size(out.size(), "indent output");
    }
    return Value::string(first ? pad + out : out);
  }
  unsupported(fmt::format("filter '{}'", name));
}
}  // namespace

bool apply_test(const std::string& name, const Value& v, CallArgs& a) {
  using T = Value::Type;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.type == T::Int;
  if (name == "float") return v.type == T::Float;
  if (name == "boolean") return v.type == T::Bool;
  if (name == "true") return v.type == T::Bool && v.b;
  if (name == "false") return v.type == T::Bool && !v.b;
  if (name == "mapping") return v.is_mapping();
  // Jinja2's Undefined iterates as empty and has a length and __getitem__: it is iterable and a
  // sequence (Gemma 3 tests a message without content with `is iterable`).
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "callable") return v.type == T::Function;
  if (name == "odd" || name == "even") {
    if (v.type != T::Int) type_error(fmt::format("'{}' test needs an integer", name));
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    Value d = a.arg(0, "num");
    if (v.type != T::Int || d.type != T::Int || d.i == 0) type_error("divisibleby needs non-zero integers");
    return v.i % d.i == 0;
  }
  if (name == "equalto" || name == "eq" || name == "sameas") return values_equal(v, a.arg(0, "other"));
  if (name == "ne") return !values_equal(v, a.arg(0, "other"));
  if (name == "in") {
    Value seq = a.arg(0, "seq");
    if (seq.is_array())
      return std::any_of(seq.arr->begin(), seq.arr->end(), [&](const Value& x) { return values_equal(x, v); });
    if (seq.is_string() && v.is_string()) return seq.s.find(v.s) != std::string::npos;
    if (seq.is_mapping()) return !seq.get_item(v).is_undefined();
    return false;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return v.s == (name == "lower" ? text::lowercase_unicode(v.s) : text::uppercase_unicode(v.s));
  }
  unsupported(fmt::format("test '{}'", name));
}

namespace {
Value string_method(const Value& v, const std::string& name) {
  const std::string s = v.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::function([s, name](CallArgs& a) {
      Value chars = a.arg(0, "chars");
      return Value::string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return Value::function([s](CallArgs& a) {
      Value maxsplit = a.arg(1, "maxsplit", Value::integer(-1));
      return split(s, a.arg(0, "sep"), maxsplit.type == Value::Type::Int ? maxsplit.i : -1);
    });
  if (name == "startswith" || name == "endswith")
    return Value::function(
        [s, name](CallArgs& a) { return Value::boolean(affix_match(s, a.arg(0, "prefix"), name == "startswith")); });
  if (name == "upper" || name == "lower" || name == "capitalize")
    return Value::function([s, name](CallArgs& a) { return apply_filter(name, Value::string(s), a); });
  if (name == "title") return Value::function([s](CallArgs&) { return Value::string(py_title(s)); });
  if (name == "replace")
    return Value::function([s](CallArgs& a) { return apply_filter("replace", Value::string(s), a); });
  return Value::undefined();
}
}  // namespace

Value method_value(const Value& v, const std::string& name) {
  if (v.is_string()) {
    Value method = string_method(v, name);
    if (!v.markup || method.type != Value::Type::Function || name == "split" || name == "startswith" ||
        name == "endswith")
      return method;
    // Markup's methods return Markup, and replace() escapes its plain-string arguments first.
    return Value::function([method, name](CallArgs& a) {
      if (name == "replace")
        for (auto& x : a.positional)
          if (x.is_string() && !x.markup) x = Value::markup_string(html_escape(x.s));
      Value out = (*method.fn)(a);
      out.markup = true;
      return out;
    });
  }
  if (v.is_mapping()) {
    if (name == "items") return Value::function([v](CallArgs&) { return items_of(v); });
    if (name == "keys")
      return Value::function([v](CallArgs&) {
        Array out;
        for (const auto& [k, x] : *v.obj) out.push_back(key_value(k));
        return Value::array(std::move(out));
      });
    if (name == "values")
      return Value::function([v](CallArgs&) {
        Array out;
        for (const auto& [k, x] : *v.obj) out.push_back(x);
        return Value::array(std::move(out));
      });
    if (name == "get")
      return Value::function([v](CallArgs& a) {
        Value got = v.get_item(a.arg(0, "key"));
        return got.is_undefined() ? a.arg(1, "default", Value::none()) : got;
      });
    return Value::undefined();
  }
  if (v.is_array()) {
    if (name == "append")
      return Value::function([v](CallArgs& a) {
        check_value_size(v.arr->size() + 1, "a list");
        v.arr->push_back(a.arg(0, "item"));
        return Value::none();
      });
    return Value::undefined();
  }
  return Value::undefined();
}

Value strftime_value(int64_t now_epoch_s) {
  return Value::function([now_epoch_s](CallArgs& a) {
    std::time_t t = now_epoch_s >= 0 ? static_cast<std::time_t>(now_epoch_s) : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    std::string fmt_s = a.arg(0, "format").to_output();
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, fmt_s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace bp::jinja
