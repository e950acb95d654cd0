// Lexer of the Jinja subset used by Hugging Face chat templates.
//
// The source is first preprocessed exactly as transformers / @huggingface/jinja do
// (\r\n and \r turned into \n, trim_blocks and lstrip_blocks on, one trailing newline dropped);
// then text runs, `{{ }}`, `{% %}` and `{# #}` are split, with `-` whitespace control applied to
// the neighbouring text, and the inside of tags is cut into names, literals and operators.
#pragma once

#include <string>
#include <vector>

namespace bp::jinja {

enum class TokType { Text, VarOpen, VarClose, BlockOpen, BlockClose, Name, String, Int, Float, Op, End };

struct Token {
  TokType type;
  std::string text;  // text run, name, decoded string literal, number or operator spelling
  int line = 1;
};

// lstrip_blocks and the dropped final newline (trim_blocks is applied by tokenize, counting lines).
std::string preprocess_template(const std::string& source);
// Throws JinjaError(Syntax) on an unterminated tag, string or an unknown character.
std::vector<Token> tokenize(const std::string& source);

}  // namespace bp::jinja
