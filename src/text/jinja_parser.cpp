// Recursive-descent parser for the Jinja subset (see jinja_parser.h for the grammar).
#include "text/jinja_parser.h"

#include <fmt/format.h>

namespace bp::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().type != TokType::End) fail(fmt::format("unexpected '{{% {} %}}'", stop_word_));
    return body;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;  // recursion guard: a hostile template must not overflow the stack

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > 200) p.fail("template nested deeper than 200 levels");
    }
    ~DepthGuard() { --p.depth_; }
  };
  std::string stop_word_;

  const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw JinjaError(JinjaError::Kind::Syntax, fmt::format("template line {}: {}", peek().line, msg));
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw JinjaError(JinjaError::Kind::Unsupported, fmt::format("template line {}: unsupported {}", peek().line, what));
  }
  bool is_op(const std::string& op, size_t k = 0) const { return peek(k).type == TokType::Op && peek(k).text == op; }
  bool is_name(const std::string& n, size_t k = 0) const { return peek(k).type == TokType::Name && peek(k).text == n; }
  void expect_op(const std::string& op) {
    if (!is_op(op)) fail(fmt::format("expected '{}' but found '{}'", op, peek().text));
    ++p_;
  }
  std::string expect_name() {
    if (peek().type != TokType::Name) fail(fmt::format("expected a name but found '{}'", peek().text));
    return next().text;
  }
  void expect_block_close() {
    if (peek().type != TokType::BlockClose) fail(fmt::format("expected '%}}' but found '{}'", peek().text));
    ++p_;
  }

  // Parses statements until a block tag whose keyword is in `stops` (left unconsumed; its keyword
  // is stored in stop_word_ and the parser sits after the keyword).
  Body parse_body(const std::vector<std::string>& stops) {
    Body body;
    for (;;) {
      const Token& tok = peek();
      if (tok.type == TokType::End) {
        if (!stops.empty()) fail(fmt::format("missing '{{% {} %}}'", stops.back()));
        return body;
      }
      if (tok.type == TokType::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->text = tok.text;
        s->line = tok.line;
        body.push_back(std::move(s));
        ++p_;
      } else if (tok.type == TokType::VarOpen) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = tok.line;
        s->expr = parse_expr();
        if (peek().type != TokType::VarClose) fail(fmt::format("expected '}}}}' but found '{}'", peek().text));
        ++p_;
        body.push_back(std::move(s));
      } else if (tok.type == TokType::BlockOpen) {
        const std::string word = peek(1).text;
        for (const auto& st : stops)
          if (word == st) {
            p_ += 2;
            stop_word_ = word;
            return body;
          }
        ++p_;
        body.push_back(parse_statement());
      } else {
        fail(fmt::format("unexpected '{}'", tok.text));
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const int line = peek().line;
    const std::string word = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (word == "if") {
      s->kind = Stmt::Kind::If;
      s->expr = parse_expr();
      expect_block_close();
      s->body = parse_body({"elif", "else", "endif"});
      if (stop_word_ == "elif") {
        --p_;  // re-read "elif" as a nested if
        t_[p_].text = "if";
        s->else_body.push_back(parse_statement());
        return s;  // the nested if consumed endif
      }
      if (stop_word_ == "else") {
        expect_block_close();
        s->else_body = parse_body({"endif"});
      }
      expect_block_close();
    } else if (word == "for") {
      s->kind = Stmt::Kind::For;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in for loop");
      ++p_;
      s->expr = parse_ternary(false);
      if (is_name("if")) {
        ++p_;
        s->filter = parse_or();
      }
      if (is_name("recursive")) unsupported("recursive for loop");
      expect_block_close();
      s->body = parse_body({"else", "endfor"});
      if (stop_word_ == "else") {
        expect_block_close();
        s->else_body = parse_body({"endfor"});
      }
      expect_block_close();
    } else if (word == "set") {
      s->text = expect_name();
      if (is_op(".")) {
        ++p_;
        s->attr = expect_name();
      }
      s->targets.push_back(s->text);
      while (is_op(",")) {
        ++p_;
        s->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        ++p_;
        s->kind = Stmt::Kind::Set;
        s->expr = parse_expr();
        expect_block_close();
      } else {
        s->kind = Stmt::Kind::SetBlock;
        expect_block_close();
        s->body = parse_body({"endset"});
        expect_block_close();
      }
    } else if (word == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pname = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++p_;
          def = parse_ternary(true);  // not parse_expr: its tuple would swallow the next parameter
        }
        s->params.emplace_back(pname, std::move(def));
        if (is_op(",")) ++p_;
      }
      expect_op(")");
      expect_block_close();
      s->body = parse_body({"endmacro"});
      expect_block_close();
    } else if (word == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      auto input = make(Expr::Kind::Name);
      input->name = kFilterBlockInput;
      --p_;  // parse_filters starts at a '|': read the filter name as if it followed one
      t_[p_] = Token{TokType::Op, "|", t_[p_].line};
      s->expr = parse_filters(std::move(input));
      expect_block_close();
      s->body = parse_body({"endfilter"});
      expect_block_close();
    } else if (word == "generation") {
      s->kind = Stmt::Kind::Generation;
      expect_block_close();
      s->body = parse_body({"endgeneration"});
      expect_block_close();
    } else if (word == "break" || word == "continue") {
      s->kind = word == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_close();
    } else {
      unsupported(fmt::format("statement '{}'", word));
    }
    return s;
  }

  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = peek().line;
    return e;
  }

  // Full expression; a bare comma list "a, b" becomes a tuple (list).
  ExprPtr parse_expr() {
    ExprPtr first = parse_ternary(true);
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::List);
    list->items.push_back(std::move(first));
    while (is_op(",")) {
      ++p_;
      list->items.push_back(parse_ternary(true));
    }
    return list;
  }

  ExprPtr parse_ternary(bool allow_cond) {
    DepthGuard guard(*this);
    ExprPtr value = parse_or();
    if (allow_cond && is_name("if")) {
      ++p_;
      auto t = make(Expr::Kind::Ternary);
      t->c = parse_or();
      t->a = std::move(value);
      if (is_name("else")) {
        ++p_;
        t->b = parse_ternary(true);
      }
      return t;
    }
    return value;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = make(Expr::Kind::Binary);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      ++p_;
      l = binary("or", std::move(l), parse_and());
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      ++p_;
      l = binary("and", std::move(l), parse_not());
    }
    return l;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      ++p_;
      auto e = make(Expr::Kind::Unary);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr l = parse_add();
    for (;;) {
      if (peek().type == TokType::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                         peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        std::string op = next().text;
        l = binary(op, std::move(l), parse_add());
      } else if (is_name("in")) {
        ++p_;
        l = binary("in", std::move(l), parse_add());
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        l = binary("not in", std::move(l), parse_add());
      } else {
        return l;
      }
    }
  }
  ExprPtr parse_add() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = binary(op, std::move(l), parse_concat());
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_mul();
    while (is_op("~")) {
      ++p_;
      l = binary("~", std::move(l), parse_mul());
    }
    return l;
  }
  ExprPtr parse_mul() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      l = binary(op, std::move(l), parse_pow());
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary();
    while (is_op("**")) {
      ++p_;
      l = binary("**", std::move(l), parse_unary());
    }
    return l;
  }
  ExprPtr parse_unary() {
    DepthGuard guard(*this);
    if (is_op("-") || is_op("+")) {
      auto e = make(Expr::Kind::Unary);
      e->name = next().text;
      e->a = parse_unary();
      return e;
    }
    return parse_filters(parse_postfix(parse_primary()));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) {  // f(*args, **kwargs): one of each, after the plain arguments
        const bool star = is_op("*");
        ExprPtr& slot = star ? e.b : e.c;
        if (slot) fail(fmt::format("more than one {} in call arguments", star ? "*args" : "**kwargs"));
        ++p_;
        slot = parse_ternary(true);
      } else if (peek().type == TokType::Name && is_op("=", 1)) {
        std::string k = next().text;
        ++p_;
        e.kwargs.emplace_back(k, parse_ternary(true));
      } else {
        e.items.push_back(parse_ternary(true));
      }
      if (is_op(","))
        ++p_;
      else if (!is_op(")"))
        fail(fmt::format("expected ',' or ')' in call arguments but found '{}'", peek().text));
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto m = make(Expr::Kind::Member);
        m->name = expect_name();
        m->a = std::move(e);
        e = std::move(m);
      } else if (is_op("[")) {
        ++p_;
        ExprPtr start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++p_;
          if (!is_op(":") && !is_op("]")) stop = parse_expr();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        auto s = make(slice ? Expr::Kind::Slice : Expr::Kind::Index);
        s->a = std::move(e);
        s->b = std::move(start);
        s->c = std::move(stop);
        if (slice) {
          s->items.push_back(std::move(step));
        }
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        auto f = make(Expr::Kind::Filter);
        f->name = expect_name();
        f->a = std::move(e);
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::Kind::Test);
        if (is_name("not")) {
          ++p_;
          t->negate = true;
        }
        t->name = expect_name();
        t->a = std::move(e);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (peek().type == TokType::String || peek().type == TokType::Int || peek().type == TokType::Float ||
                   (peek().type == TokType::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
          t->items.push_back(parse_primary());  // "is equalto 'x'", "is sameas none"
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    if (tok.type == TokType::String) {
      auto e = make(Expr::Kind::Literal);
      std::string s = next().text;
      while (peek().type == TokType::String) s += next().text;  // adjacent literals concatenate
      e->literal = Value::string(s);
      return e;
    }
    if (tok.type == TokType::Int) {
      auto e = make(Expr::Kind::Literal);
      e->literal = Value::integer(std::stoll(next().text));
      return e;
    }
    if (tok.type == TokType::Float) {
      auto e = make(Expr::Kind::Literal);
      e->literal = Value::number(std::stod(next().text));
      return e;
    }
    if (tok.type == TokType::Name) {
      auto e = make(Expr::Kind::Name);
      e->name = next().text;
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        auto e = make(Expr::Kind::List);
        return e;
      }
      ExprPtr inner = parse_expr();
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      ++p_;
      auto e = make(Expr::Kind::List);
      while (!is_op("]")) {
        e->items.push_back(parse_ternary(true));
        if (is_op(","))
          ++p_;
        else if (!is_op("]"))
          fail(fmt::format("expected ',' or ']' in list but found '{}'", peek().text));
      }
      ++p_;
      return e;
    }
    if (is_op("{")) {
      ++p_;
      auto e = make(Expr::Kind::Dict);
      while (!is_op("}")) {
        e->items.push_back(parse_ternary(true));
        expect_op(":");
        e->items.push_back(parse_ternary(true));
        if (is_op(","))
          ++p_;
        else if (!is_op("}"))
          fail(fmt::format("expected ',' or '}}' in dict but found '{}'", peek().text));
      }
      ++p_;
      return e;
    }
    fail(fmt::format("unexpected '{}' in expression", tok.text.empty() ? "end of tag" : tok.text));
  }
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(tokenize(source)).parse_all();
}

}  // namespace bp::jinja
