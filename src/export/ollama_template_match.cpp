// Jinja chat template -> Ollama Go template (export/ollama.h), by rendering, never by marker strings.
//
// A Go template is accepted only when Ollama, rendering it for a probe conversation, produces
// exactly the bytes our Jinja interpreter (text/chat_template.h, what training used) produces for
// the same conversation. The probes: [system, user, assistant, user] and [user, assistant, user]
// and their one-user forms, all with the generation prompt (the prompt Ollama sends the model).
// Probes the template rejects (raise_exception: e.g. no system role) are skipped; the no-system
// ones must render.
//
// Order: each known family's Go template (ChatML, Llama-3, Gemma, Llama-2, Mistral), with the
// template's default system prompt (one it adds to chats without a system message, found by
// rendering) as the Modelfile's SYSTEM; else a template derived from the rendered pieces (below),
// checked the same way; else the plain "{{ .Prompt }}" template with fallback = true and a warning
// naming the first difference.
//
// Derivation. With sentinel contents U1, A1, U2 the no-system probe renders
//   n0 U1 n1 A1 n2 U2 n3
// n0 opens a user turn; n3 is the generation prompt: what closes a user turn (the one-user chat
// rendered without the generation prompt ends with it) and then the assistant header; n1 = n3 + R,
// R being text before an assistant's content; n2 = Y + n0, Y closing an assistant turn. The
// system probe renders p0 S p1 U1 ...: either a block of its own before the user turn (p1 ends
// with n0) or text inside the first user turn (p0 starts with n0, as Llama-2 and Gemma do). Those
// pieces become Ollama's legacy template, which Ollama executes once per (system, prompt,
// response) turn and, for the last turn, cuts after {{ .Response }} (ollama/template/template.go
// Execute); render_ollama_template below does the same.
//
// Tokens: probes render with bos_token "": llama.cpp and Ollama add BOS as a token where the GGUF
// says add_bos_token (training got it from the rendered text); eos_token is the first end token.
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "export/ollama.h"
#include "text/chat_template.h"

namespace bp {
namespace {

// One family: its Go template (Ollama's legacy .System/.Prompt/.Response form), stops, and the
// markers (all in the Jinja template) that make it the approximate choice when nothing renders exactly.
struct Family {
  const char* name;
  const char* go_template;
  std::vector<const char*> stops;
  std::vector<const char*> markers;
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {"chatml",
       "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
       "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
       "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n",
       {"<|im_start|>", "<|im_end|>"},
       {"<|im_start|>"}},
      {"llama3",
       "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
       "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
       "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>",
       {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       {"<|start_header_id|>"}},
      {"gemma",
       "<start_of_turn>user\n{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}<end_of_turn>\n"
       "<start_of_turn>model\n{{ .Response }}<end_of_turn>\n",
       {"<start_of_turn>", "<end_of_turn>"},
       {"<start_of_turn>"}},
      // Meta's Llama-2-chat template: ' ' + answer + ' ' + eos after [/INST], nothing in the prompt.
      {"llama2",
       "[INST] {{ if .System }}<<SYS>>\n{{ .System }}\n<</SYS>>\n\n{{ end }}{{ .Prompt }} [/INST]"
       "{{ if .Response }} {{ end }}{{ .Response }} </s>",
       {"[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"},
       {"[INST]", "<<SYS>>"}},
      {"mistral",
       "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }} [/INST]{{ .Response }}</s>",
       {"[INST]", "[/INST]"},
       {"[INST]"}},
  };
  return f;
}

// ---- Ollama's legacy Go templates: text, {{ .System }} {{ .Prompt }} {{ .Response }}, {{ if .X }}..{{ end }}

struct GoNode {
  enum class Kind { Text, Field, If } kind = Kind::Text;
  std::string text;  // Text: the text; Field / If: the field name
  std::vector<GoNode> body;
};

std::string trim_ws(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

[[noreturn]] void unsupported_action(const std::string& action) {
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[ollama] template action '{{{{{}}}}}' is not one of .System, .Prompt, .Response, "
                          "if .X, end",
                          action));
}

// Parses [pos, end of template or {{ end }}) into `out`; returns after the {{ end }} when `in_if`.
size_t parse_go(const std::string& t, size_t pos, std::vector<GoNode>& out, bool in_if) {
  while (pos < t.size()) {
    const size_t open = t.find("{{", pos);
    if (open != pos) {
      const size_t stop = open == std::string::npos ? t.size() : open;
      out.push_back({GoNode::Kind::Text, t.substr(pos, stop - pos), {}});
      pos = stop;
      continue;
    }
    const size_t close = t.find("}}", open);
    if (close == std::string::npos) unsupported_action(t.substr(open));
    const std::string action = trim_ws(t.substr(open + 2, close - open - 2));
    pos = close + 2;
    if (action == "end") {
      if (!in_if) unsupported_action(action);
      return pos;
    }
    if (action.rfind("if .", 0) == 0) {
      GoNode n{GoNode::Kind::If, action.substr(4), {}};
      pos = parse_go(t, pos, n.body, true);
      out.push_back(std::move(n));
    } else if (action == ".System" || action == ".Prompt" || action == ".Response") {
      out.push_back({GoNode::Kind::Field, action.substr(1), {}});
    } else {
      unsupported_action(action);
    }
  }
  if (in_if) unsupported_action("if (no end)");
  return pos;
}

struct GoVars {
  std::string system, prompt, response;
  const std::string& get(const std::string& name) const {
    if (name == "System") return system;
    if (name == "Prompt") return prompt;
    if (name == "Response") return response;
    unsupported_action("." + name);
  }
};

bool mentions_response(const std::vector<GoNode>& nodes) {
  for (const auto& n : nodes)
    if ((n.kind == GoNode::Kind::Field && n.text == "Response") ||
        (n.kind == GoNode::Kind::If && mentions_response(n.body)))
      return true;
  return false;
}

// cut: Ollama's last turn, where every node after the first {{ .Response }} (in the template's text
// order, whatever the conditions) is deleted. `cut_seen` says that node has been passed.
void exec_go(const std::vector<GoNode>& nodes, const GoVars& v, bool cut, bool& cut_seen, std::string& out) {
  for (const auto& n : nodes) {
    if (cut && cut_seen) return;
    switch (n.kind) {
      case GoNode::Kind::Text: out += n.text; break;
      case GoNode::Kind::Field:
        out += v.get(n.text);
        if (n.text == "Response") cut_seen = true;
        break;
      case GoNode::Kind::If:
        if (!v.get(n.text).empty())
          exec_go(n.body, v, cut, cut_seen, out);
        else if (mentions_response(n.body))
          cut_seen = true;
        break;
    }
  }
}

// ---- probes

const char* const kSys = "xSYSx7";
const char* const kUser1 = "xUSR1x7";
const char* const kAsst1 = "xAST1x7";
const char* const kUser2 = "xUSR2x7";

struct Probe {
  Conversation conv;
  bool has_system;
  std::optional<std::string> rendered;  // nullopt: the template rejects it
  bool generation_prompt = true;        // false: a piece for derive(), not what Ollama sends
};

// Splits `s` at each of `parts` in order (each must occur exactly once); nullopt otherwise.
std::optional<std::vector<std::string>> split_at(const std::string& s, const std::vector<const char*>& parts) {
  std::vector<std::string> pieces;
  size_t pos = 0;
  for (const char* p : parts) {
    const size_t at = s.find(p, pos);
    if (at == std::string::npos || s.find(p, at + 1) != std::string::npos) return std::nullopt;
    pieces.push_back(s.substr(pos, at - pos));
    pos = at + std::string(p).size();
  }
  pieces.push_back(s.substr(pos));
  return pieces;
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The first difference between what Ollama renders (with `system` as the Modelfile's SYSTEM) and
// what the template renders, "" when none.
std::string first_difference(const std::string& go_template, const std::vector<Probe>& probes,
                             const std::string& system) {
  for (const auto& p : probes) {
    if (!p.rendered || !p.generation_prompt) continue;
    const std::string got = render_ollama_template(go_template, p.conv, system);
    if (got == *p.rendered) continue;
    size_t i = 0;
    while (i < got.size() && i < p.rendered->size() && got[i] == (*p.rendered)[i]) ++i;
    const size_t from = i > 20 ? i - 20 : 0;
    return fmt::format("for a chat [{}] the chat template renders \"{}\" where an Ollama template gives \"{}\"",
                       p.has_system ? "system, user, ..." : "user, ...", p.rendered->substr(from, 50),
                       got.substr(from, 50));
  }
  return "";
}

// A system prompt the template puts in when the chat has none (Qwen2.5's "You are Qwen, ...",
// SmolLM2's): the text D for which the chats without a system message render exactly as they do
// with D as their system message. Ollama gets it as the Modelfile's SYSTEM. "" when none.
std::string default_system_prompt(const ChatTemplate& tmpl, const std::vector<Probe>& probes) {
  if (!probes[1].rendered || !probes[3].rendered) return "";
  const auto a = split_at(*probes[1].rendered, {kUser1});
  const auto q = split_at(*probes[3].rendered, {kSys, kUser1});
  if (!a || !q) return "";
  const std::string &a0 = (*a)[0], &q0 = (*q)[0], &q1 = (*q)[1];
  if (a0.size() <= q0.size() + q1.size() || !starts_with(a0, q0) || !ends_with(a0, q1)) return "";
  const std::string d = a0.substr(q0.size(), a0.size() - q0.size() - q1.size());
  if (d.find("\"\"\"") != std::string::npos) return "";  // cannot be a Modelfile SYSTEM
  for (const size_t i : {size_t{0}, size_t{1}}) {
    Conversation with = probes[i].conv;
    with.insert(with.begin(), {"system", d});
    try {
      if (tmpl.render(with, true) != *probes[i].rendered) return "";
    } catch (const Error&) {
      return "";
    }
  }
  return d;
}

// The derivation of the file comment; nullopt when the pieces do not fit that shape.
std::optional<OllamaTemplate> derive(const std::vector<Probe>& probes) {
  const auto n = split_at(*probes[0].rendered, {kUser1, kAsst1, kUser2});
  if (!n) return std::nullopt;
  const std::string &n0 = (*n)[0], &n1 = (*n)[1], &n2 = (*n)[2], &n3 = (*n)[3];
  if (!starts_with(n1, n3) || !ends_with(n2, n0)) return std::nullopt;
  const std::string response_prefix = n1.substr(n3.size());
  const std::string end_of_turn = n2.substr(0, n2.size() - n0.size());
  std::vector<std::string> pieces = *n;  // literal text of the Go template: no "{{" allowed
  // What closes a user turn (the one-user chat without the generation prompt ends with it) goes
  // with the prompt, the rest of the generation prompt opens the answer.
  std::string user_end;
  if (const auto u = probes[4].rendered ? split_at(*probes[4].rendered, {kUser1}) : std::nullopt)
    if (starts_with(n3, (*u)[1])) user_end = (*u)[1];
  const std::string answer_start = n3.substr(user_end.size());
  std::string system_block, user_block = "{{ if .Prompt }}" + n0 + "{{ .Prompt }}" + user_end + "{{ end }}";
  if (probes[2].rendered) {
    const auto p = split_at(*probes[2].rendered, {kSys, kUser1});
    if (!p) return std::nullopt;
    const std::string &p0 = (*p)[0], &p1 = (*p)[1];
    pieces.insert(pieces.end(), {p0, p1});
    if (ends_with(p1, n0)) {  // a system turn of its own
      system_block = "{{ if .System }}" + p0 + "{{ .System }}" + p1.substr(0, p1.size() - n0.size()) + "{{ end }}";
    } else if (starts_with(p0, n0)) {  // inside the first user turn
      user_block =
          n0 + "{{ if .System }}" + p0.substr(n0.size()) + "{{ .System }}" + p1 + "{{ end }}{{ .Prompt }}" + user_end;
    } else {
      return std::nullopt;
    }
  }
  OllamaTemplate t;
  t.family = "derived";
  t.go_template = system_block + user_block + answer_start +
                  (response_prefix.empty() ? "" : "{{ if .Response }}" + response_prefix + "{{ end }}") +
                  "{{ .Response }}" + end_of_turn;
  for (const std::string& piece : pieces)
    if (piece.find("{{") != std::string::npos) return std::nullopt;
  if (t.go_template.find("\"\"\"") != std::string::npos) return std::nullopt;  // cannot be a Modelfile TEMPLATE
  for (const std::string& stop : {trim_ws(end_of_turn), trim_ws(n0)})
    if (!stop.empty() && std::find(t.stops.begin(), t.stops.end(), stop) == t.stops.end()) t.stops.push_back(stop);
  return t;
}

}  // namespace

std::string render_ollama_template(const std::string& go_template, const Conversation& messages,
                                   const std::string& modelfile_system) {
  std::vector<GoNode> nodes;
  parse_go(go_template, 0, nodes, false);
  // The server puts the Modelfile's SYSTEM first when the chat has no system message; then
  // collate: consecutive messages of one role become one, joined by a blank line.
  Conversation msgs;
  if (!modelfile_system.empty() && (messages.empty() || messages[0].role != "system"))
    msgs.push_back({"system", modelfile_system});
  for (const auto& m : messages)
    if (!msgs.empty() && msgs.back().role == m.role)
      msgs.back().content += "\n\n" + m.content;
    else
      msgs.push_back(m);
  std::string out;
  GoVars v;
  auto execute = [&] {
    bool seen = false;
    exec_go(nodes, v, false, seen, out);
    v = GoVars{};
  };
  for (const auto& m : msgs) {
    if (m.role == "system") {
      if (!v.prompt.empty() || !v.response.empty()) execute();
      v.system = m.content;
    } else if (m.role == "user") {
      if (!v.response.empty()) execute();
      v.prompt = m.content;
    } else if (m.role == "assistant") {
      v.response = m.content;
    }
  }
  bool seen = false;
  exec_go(nodes, v, true, seen, out);
  return out;
}

OllamaTemplate ollama_template_from_jinja(const std::string& jinja, const std::vector<std::string>& end_tokens) {
  OllamaTemplate t;
  std::string why = "the model has no chat template";
  if (!jinja.empty()) {
    std::vector<Probe> probes = {
        {{{"user", kUser1}, {"assistant", kAsst1}, {"user", kUser2}}, false, {}},
        {{{"user", kUser1}}, false, {}},
        {{{"system", kSys}, {"user", kUser1}, {"assistant", kAsst1}, {"user", kUser2}}, true, {}},
        {{{"system", kSys}, {"user", kUser1}}, true, {}},
        {{{"user", kUser1}}, false, {}, false},
    };
    try {
      const ChatTemplate tmpl(ChatTemplateSource{ChatTemplateSource::Kind::ModelConfigKey, jinja, "(export)"}, "",
                              end_tokens.empty() ? "" : end_tokens.front());
      for (auto& p : probes) try {
          p.rendered = tmpl.render(p.conv, p.generation_prompt);
        } catch (const Error&) {  // rejected (e.g. no system role): not a probe of this template
        }
      if (!probes[0].rendered || !probes[1].rendered) {
        why = "the chat template rejects a plain user/assistant chat";
      } else {
        const std::string system = default_system_prompt(tmpl, probes);
        for (const auto& f : families())
          if (first_difference(f.go_template, probes, system).empty()) {
            t.family = f.name;
            t.go_template = f.go_template;
            t.stops.assign(f.stops.begin(), f.stops.end());
            t.default_system = system;
            break;
          }
        if (t.family.empty()) {
          const auto d = system.empty() ? derive(probes) : std::nullopt;
          why = d ? first_difference(d->go_template, probes, "")
                  : "its turns do not split into Ollama's system, user and assistant pieces";
          if (d && why.empty()) t = *d;
        }
        // Nothing renders it exactly, but it is plainly one family's (Llama-3.1's dated system
        // header, Mistral's system prompt in the last user turn): that family's template, said to
        // be approximate, serves far better than the plain one.
        if (t.family.empty())
          for (const auto& f : families())
            if (std::all_of(f.markers.begin(), f.markers.end(),
                            [&](const char* m) { return jinja.find(m) != std::string::npos; })) {
              t.family = f.name;
              t.go_template = f.go_template;
              t.stops.assign(f.stops.begin(), f.stops.end());
              t.approximate = true;
              t.warning = fmt::format(
                  "the Modelfile uses Ollama's {} template, which renders this chat template's turns only "
                  "approximately ({}); check the answers of `ollama run`",
                  f.name, why);
              break;
            }
      }
    } catch (const Error& e) {  // a template our interpreter cannot run (training could not have used it)
      why = fmt::format("the chat template cannot be rendered here ({})", e.what());
    }
  }
  if (t.family.empty()) {
    t.family = "none";
    t.fallback = true;
    t.go_template = "{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}{{ .Response }}";
    t.warning = fmt::format(
        "the chat template is none of the families the Modelfile knows (ChatML, Llama-3, Llama-2/Mistral, Gemma) "
        "and no Ollama template renders it exactly ({}); the Modelfile uses a plain {{{{ .Prompt }}}} template",
        why);
  }
  for (const auto& e : end_tokens)
    if (!e.empty() && std::find(t.stops.begin(), t.stops.end(), e) == t.stops.end()) t.stops.push_back(e);
  return t;
}

}  // namespace bp
