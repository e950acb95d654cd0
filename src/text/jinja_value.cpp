// Jinja runtime values: construction, truthiness, printing, JSON conversion, equality.
#include "text/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja_strings.h"

namespace bp::jinja {

namespace {
thread_local const RenderLimits* g_limits = nullptr;
constexpr int kMaxJsonDepth = 512;  // also stops a list that contains itself (l.append(l))
}  // namespace

void check_value_size(size_t n, const char* what) {
  if (g_limits && n > static_cast<uint64_t>(std::max<int64_t>(g_limits->max_bytes, 0)))
    throw JinjaError(JinjaError::Kind::Budget, fmt::format("{} grew to {} bytes or items, past the limit of {} "
                                                           "(setting data.template_max_bytes)",
                                                           what, n, g_limits->max_bytes));
}

ScopedRenderLimits::ScopedRenderLimits(const RenderLimits& limits) : previous_(g_limits) {
  g_limits = &limits;
}
ScopedRenderLimits::~ScopedRenderLimits() {
  g_limits = previous_;
}

Value Value::none() {
  Value v;
  v.type = Type::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.type = Type::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.type = Type::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.type = Type::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  check_value_size(x.size(), "a string");  // every string a render builds is held to its budget
  Value v;
  v.type = Type::String;
  v.s = std::move(x);
  return v;
}
Value Value::markup_string(std::string x) {
  Value v = string(std::move(x));
  v.markup = true;
  return v;
}
Value Value::array(Array x) {
  Value v;
  v.type = Type::Array;
  v.arr = std::make_shared<Array>(std::move(x));
  return v;
}
Value Value::object(Object x) {
  Value v;
  v.type = Type::Object;
  v.obj = std::make_shared<Object>(std::move(x));
  return v;
}
Value Value::ns(Object x) {
  Value v = object(std::move(x));
  v.type = Type::Namespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.type = Type::Function;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json(it.value()));
      return object(std::move(o));
    }
    default: return undefined();
  }
}

bool Value::truthy() const {
  switch (type) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return b;
    case Type::Int: return i != 0;
    case Type::Float: return f != 0.0;
    case Type::String: return !s.empty();
    case Type::Array: return !arr->empty();
    case Type::Object:
    case Type::Namespace: return !obj->empty();
    case Type::Function: return true;
  }
  return false;
}

static std::string format_float(double f) {
  if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 1e16) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", f);
    return buf;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", f);
  // Shortest representation that round-trips, as Python's repr does.
  for (int prec = 1; prec <= 17; ++prec) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", prec, f);
    if (std::strtod(b2, nullptr) == f) return b2;
  }
  return buf;
}

std::string Value::to_output() const {
  switch (type) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return b ? "True" : "False";
    case Type::Int: return std::to_string(i);
    case Type::Float: return format_float(f);
    case Type::String: return s;
    case Type::Array:
    case Type::Object:
    case Type::Namespace: return repr();
    case Type::Function: return "<function>";
  }
  return "";
}

std::string Value::repr(int depth) const {
  if (depth > kMaxJsonDepth)
    throw JinjaError(JinjaError::Kind::Budget,
                     fmt::format("printing a value nested deeper than {} levels (a list or dict that contains itself?)",
                                 kMaxJsonDepth));
  switch (type) {
    case Type::Undefined: return "Undefined";
    case Type::String: return py_repr(s);
    case Type::Array: {
      std::string out = "[";
      for (size_t k = 0; k < arr->size(); ++k) {
        if (k) out += ", ";
        out += (*arr)[k].repr(depth + 1);
        check_value_size(out.size(), "a printed list");
      }
      return out + "]";
    }
    case Type::Object:
    case Type::Namespace: {
      std::string out = type == Type::Namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < obj->size(); ++k) {
        if (k) out += ", ";
        out += key_value((*obj)[k].first).repr(depth + 1) + ": " + (*obj)[k].second.repr(depth + 1);
        check_value_size(out.size(), "a printed dict");
      }
      return out + (type == Type::Namespace ? "}>" : "}");
    }
    default: return to_output();
  }
}

static std::string json_string(const std::string& s) {
  // nlohmann escapes like JSON.stringify / json.dumps(ensure_ascii=False) for these cases.
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Value::to_json(int indent, int depth) const {
  if (depth > kMaxJsonDepth)
    throw JinjaError(JinjaError::Kind::Budget,
                     fmt::format("tojson: value nested deeper than {} levels (a list or dict that contains itself?)",
                                 kMaxJsonDepth));
  const std::string item_sep = indent >= 0 ? "," : ", ";
  std::string pad_in, pad_out;
  if (indent >= 0) {
    pad_in.assign(1, '\n');
    pad_in.append(static_cast<size_t>(indent) * static_cast<size_t>(depth + 1), ' ');
    pad_out.assign(1, '\n');
    pad_out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
  }
  switch (type) {
    case Type::Undefined:  // json.dumps raises on Jinja2's Undefined (and on a macro)
    case Type::Function:
      throw JinjaError(JinjaError::Kind::Runtime, fmt::format("tojson: Object of type {} is not JSON serializable",
                                                              type == Type::Function ? "function" : "Undefined"));
    case Type::None: return "null";
    case Type::Bool: return b ? "true" : "false";
    case Type::Int: return std::to_string(i);
    case Type::Float: return format_float(f);
    case Type::String: return json_string(s);
    case Type::Array: {
      if (arr->empty()) return "[]";
      std::string out = "[";
      for (size_t k = 0; k < arr->size(); ++k) {
        if (k) out += item_sep;
        out += pad_in + (*arr)[k].to_json(indent, depth + 1);
        check_value_size(out.size(), "tojson output");
      }
      return out + pad_out + "]";
    }
    case Type::Object:
    case Type::Namespace: {
      if (obj->empty()) return "{}";
      std::string out = "{";
      for (size_t k = 0; k < obj->size(); ++k) {
        if (k) out += item_sep;
        // json.dumps writes an integer key as a string of its digits.
        out += pad_in + json_string(key_value((*obj)[k].first).to_output()) + ": " +
               (*obj)[k].second.to_json(indent, depth + 1);
        check_value_size(out.size(), "tojson output");
      }
      return out + pad_out + "}";
    }
  }
  return "null";
}

Value Value::get(const std::string& key) const {
  if (!is_mapping()) return undefined();
  for (const auto& [k, v] : *obj)
    if (k == key) return v;
  return undefined();
}

Value Value::get_item(const Value& key) const {
  const auto k = dict_key(key);
  return k ? get(*k) : undefined();
}

std::optional<std::string> dict_key(const Value& key) {
  using T = Value::Type;
  auto int_key = [](int64_t i) {
    std::string k(1, '\xFF');
    k.append(std::to_string(i));
    return k;
  };
  switch (key.type) {
    case T::String: return key.s;
    case T::Int: return int_key(key.i);
    case T::Bool: return int_key(key.b ? 1 : 0);
    case T::Float:
      if (std::isfinite(key.f) && key.f == std::floor(key.f) && std::fabs(key.f) < 9e18)
        return int_key(static_cast<int64_t>(key.f));
      return std::nullopt;
    default: return std::nullopt;
  }
}

Value key_value(const std::string& stored) {
  if (!stored.empty() && static_cast<unsigned char>(stored[0]) == 0xFF)
    return Value::integer(std::stoll(stored.substr(1)));
  return Value::string(stored);
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *obj)
    if (k == key) {
      old = std::move(v);
      return;
    }
  obj->emplace_back(key, std::move(v));
}

const char* Value::type_name() const {
  switch (type) {
    case Type::Undefined: return "undefined";
    case Type::None: return "none";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "string";
    case Type::Array: return "list";
    case Type::Object: return "dict";
    case Type::Namespace: return "namespace";
    case Type::Function: return "function";
  }
  return "?";
}

bool values_equal(const Value& a, const Value& b) {
  thread_local int depth = 0;  // a list that contains itself must not overflow the stack
  if (depth > kMaxJsonDepth)
    throw JinjaError(JinjaError::Kind::Budget, fmt::format("comparison nested deeper than {} levels", kMaxJsonDepth));
  struct Guard {
    Guard() { ++depth; }
    ~Guard() { --depth; }
  } guard;
  using T = Value::Type;
  auto num = [](const Value& v) {
    return v.type == T::Int ? static_cast<double>(v.i) : v.type == T::Bool ? (v.b ? 1.0 : 0.0) : v.f;
  };
  const bool a_num = a.is_number() || a.type == T::Bool, b_num = b.is_number() || b.type == T::Bool;
  if (a_num && b_num) return num(a) == num(b);
  if (a.type != b.type) return false;
  switch (a.type) {
    case T::Undefined:
    case T::None: return true;
    case T::String: return a.s == b.s;
    case T::Array:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!values_equal((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case T::Object:
    case T::Namespace:
      if (a.obj == b.obj) return true;
      if (a.obj->size() != b.obj->size()) return false;
      for (const auto& [k, v] : *a.obj)
        if (!values_equal(v, b.get(k))) return false;
      return true;
    default: return a.fn == b.fn;
  }
}

Value CallArgs::arg(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}

}  // namespace bp::jinja
