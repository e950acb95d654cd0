// Parser of the Jinja subset: tokens -> a tree of statements and expressions.
//
// Statements: text, {{ expr }}, if/elif/else, for (with optional `if` filter, `else`, tuple
// targets), set (name, tuple, ns.attr, and block set), macro, break/continue, filter blocks, and
// transformers' generation blocks ({% generation %} marks the assistant text to train on). Expressions follow Jinja's
// precedence: ternary < or < and < not < comparison
// (==, !=, <, >, <=, >=, in, not in) < + - < ~ < * / // % < ** < unary - < postfix (., [], slices,
// calls) with filters (|) and tests (is [not]). Anything else throws JinjaError(Unsupported)
// naming the construct, which the chat-template layer turns into its ChatML fallback.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace bp::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { Literal, Name, List, Dict, Member, Index, Slice, Call, Filter, Test, Unary, Binary, Ternary };
  Kind kind;
  int line = 0;
  Value literal;               // Literal
  std::string name;            // Name / Member attr / Filter & Test name / Unary & Binary op
  std::vector<ExprPtr> items;  // List items, Dict keys/values interleaved, Call/Filter/Test positional args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call/Filter keyword args
  ExprPtr a, b, c;      // operands (object, index/start, stop, step / cond); Call/Filter/Test: b = *args, c = **kwargs
  bool negate = false;  // Test: "is not"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Generation };
  Kind kind;
  int line = 0;
  std::string text;                  // Text; Set/SetBlock/Macro target name
  std::vector<std::string> targets;  // For / Set tuple targets
  std::string attr;                  // Set ns.attr
  ExprPtr expr;                      // Output, If cond, For iterable, Set value, FilterBlock filters
  ExprPtr filter;                    // For ... if cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro params with optional defaults
};

// The variable a filter block's expression reads its rendered body from.
inline constexpr const char* kFilterBlockInput = "\x01filter_block";

// Throws JinjaError(Syntax) on malformed input and JinjaError(Unsupported) on constructs
// outside the subset (naming them, e.g. "unsupported statement 'include'").
Body parse_template(const std::string& source);

}  // namespace bp::jinja
