// Task metric for held-out conversations: exact match of greedy answers (issue 8).
//
// Each held-out conversation becomes a prompt (every message before its last assistant message)
// and a reference (that message's content). The prompt is rendered with the chat template and
// the generation prompt, the model answers greedily (model/generate.h, KV cache) until an eos id
// or max_new_tokens, and the decoded answer (special tokens skipped) is compared with the
// reference after normalisation: surrounding whitespace trimmed, runs of whitespace collapsed to
// one space, ASCII letters lower-cased. Nothing else is forgiven ("Answer: red." and "red" differ).
//
// The trainer's no-argument quick start calls evaluate_task before and after fine-tuning and
// prints the exact-match rate and the first example's prompt, reference and answer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/transformer.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace bp {

struct TaskExample {
  Conversation prompt;    // ends with a user message
  std::string reference;  // the expected assistant answer
};

// Splits each conversation at its last assistant message (later messages are dropped).
// A conversation without an assistant message, or whose last assistant message is first, throws
// INPUT_VALIDATION_FAILED naming its index.
std::vector<TaskExample> task_examples_from_conversations(const std::vector<Conversation>& conversations);

// Reads a held-out file in any format load_dataset understands (ShareGPT, OpenAI, Alpaca) and
// splits its conversations as above. Bad rows are skipped as check_dataset does (strict: an
// error); plain-text rows have no answer to compare with: INPUT_DATASET_INVALID.
// chat: the rows' tools, reasoning and tool arguments as training reads them (data.tools, ...).
std::vector<TaskExample> load_task_examples(const std::string& path, DatasetFormat format = DatasetFormat::Auto,
                                            bool strict = false, const ChatDataOptions& chat = {});

struct TaskEvalOptions {
  int64_t max_new_tokens = 32;
  int64_t max_examples = 0;  // 0 = all; else the first n examples
};

struct TaskAnswer {
  std::string prompt;     // the last user message of the prompt (what a person would read)
  std::string reference;  // expected answer
  std::string output;     // decoded greedy answer, eos not included
  bool exact = false;
  int64_t new_tokens = 0;
};

struct TaskEvalResult {
  int64_t num_examples = 0;
  int64_t num_exact = 0;
  std::vector<TaskAnswer> answers;  // in example order
  double exact_match() const { return num_examples ? double(num_exact) / double(num_examples) : 0.0; }
};

// Greedy-answers every example with the model as it is (attached LoRA included; dropout off).
// Stop ids are the tokenizer's eos ids, else the model config's. A rendered prompt longer than
// the model's context throws INPUT_VALIDATION_FAILED naming the example.
TaskEvalResult evaluate_task(const Model& model, const Tokenizer& tok, const ChatTemplate& tmpl,
                             const std::vector<TaskExample>& examples, const TaskEvalOptions& opts = {});

// The normalisation described above, and the comparison built on it.
std::string normalize_answer(std::string_view s);
bool answers_match(std::string_view output, std::string_view reference);

}  // namespace bp
