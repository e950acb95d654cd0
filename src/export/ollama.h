// Ollama integration for GGUF exports: a Modelfile (FROM, TEMPLATE, PARAMETER stop / num_ctx) and
// registration through Ollama's HTTP API at OLLAMA_HOST (default 127.0.0.1:11434):
//   1. HEAD /api/blobs/sha256:<digest>      200 = already there, 404 = upload it
//   2. POST /api/blobs/sha256:<digest>      body = the GGUF file; 201 Created (400 = digest mismatch)
//   3. POST /api/create  {"model", "files": {"<file>.gguf": "sha256:<digest>"}, "template",
//                         "parameters": {"stop": [...], "num_ctx": N}, "stream": false}
//      with a LoRA adapter: "adapters": {"<adapter>.gguf": "sha256:<digest>"} beside "files", or
//      beside "from": "<existing model>" (an Ollama base: nothing re-uploaded or re-quantized),
//      and "system" when the base has a system prompt.
//                                           200 {"status": "success"}; errors are {"error": "..."}
// Each request is retried with exponential backoff on connection failures, timeouts, 429 and 5xx;
// other 4xx answers fail at once. Failure -> DEP_OLLAMA_REGISTRATION_FAILED (retryable), with
// `ollama serve` suggested when nothing listens.
//
// Chat templates (Jinja, text/chat_template_source.h) become Ollama Go templates by rendering
// (export/ollama_template_match.cpp): a family's template (ChatML, Llama-3, Gemma, Llama-2,
// Mistral) or one derived from the rendered turns is used only when Ollama would render probe
// chats to exactly the bytes the Jinja template renders; anything else gets a plain
// "{{ .Prompt }}" template, `fallback = true` and a `warning` naming the difference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/chat_template.h"

namespace bp {

struct OllamaTemplate {
  std::string family;  // "chatml", "llama3", "llama2", "mistral", "gemma", "derived", "none"
  std::string go_template;
  std::vector<std::string> stops;
  bool fallback = false;     // the plain {{ .Prompt }} template: no family fits
  bool approximate = false;  // a family chosen by its markers: it does not render the template exactly
  std::string warning;       // set with fallback or approximate: why, for the export's warnings
  // The system prompt the chat template adds when a chat has none (Qwen2.5, SmolLM2): the
  // Modelfile's SYSTEM (and /api/create's "system") unless the caller gives one.
  std::string default_system;
};

// `end_tokens` (the tokenizer's eos strings) are added to the family's stop strings; the first is
// the template's eos_token. bos_token renders as "" (llama.cpp and Ollama add BOS as a token).
OllamaTemplate ollama_template_from_jinja(const std::string& chat_template, const std::vector<std::string>& end_tokens);

// What Ollama sends the model for `messages` with a legacy Go template (.System, .Prompt,
// .Response, {{ if .X }}...{{ end }}; other actions throw INPUT_VALIDATION_FAILED): the template
// once per (system, user, assistant) turn, the last one cut after {{ .Response }}, as
// ollama/template/template.go's Execute does.
// `modelfile_system` is the Modelfile's SYSTEM, put first when the chat has no system message.
std::string render_ollama_template(const std::string& go_template, const Conversation& messages,
                                   const std::string& modelfile_system = "");

// The Modelfile text: FROM `from` (a GGUF path, written as given: pass an absolute path, or an
// Ollama model name), ADAPTER `adapter_path` when given, TEMPLATE when t.go_template is not empty,
// SYSTEM `system`, else t.default_system, when not empty, PARAMETER stop / num_ctx (num_ctx 0 = none).
std::string make_modelfile(const std::string& from, const OllamaTemplate& t, int64_t num_ctx,
                           const std::string& adapter_path = "", const std::string& system = "");

// Ollama's model-name rules: [host/][namespace/]model[:tag]; each part starts with a letter, digit
// or '_' and continues with those, '-' or '.' (no '.' in the namespace); host up to 350 characters,
// the others up to 80. Throws INPUT_VALIDATION_FAILED naming the offending part.
void validate_ollama_model_name(const std::string& name);

struct OllamaEndpoint {
  std::string host = "127.0.0.1";
  int port = 11434;
  // Credentials given in the URL (http://user:pass@host): sent as HTTP basic auth, never part of
  // str() (which messages print).
  std::string user, password;
  std::string str() const { return host + ":" + std::to_string(port); }
};
// OLLAMA_HOST forms: "", "host", "host:port", "http://host[:port]", "0.0.0.0[:port]" (-> 127.0.0.1),
// each optionally with "user[:password]@" before the host.
// https and malformed ports -> INPUT_VALIDATION_FAILED.
OllamaEndpoint parse_ollama_host(const std::string& value);

struct OllamaOptions {
  std::string host;  // empty: $OLLAMA_HOST, else 127.0.0.1:11434
  int max_attempts = 5;
  double backoff_initial_s = 0.5;
  double backoff_max_s = 8.0;
  double connect_timeout_s = 5.0;
  double request_timeout_s = 60.0;  // read/write timeout per request (blob uploads stream)
};

struct OllamaResult {
  std::string model;
  std::string digest;          // "sha256:<hex>" of the GGUF model file ("" when created FROM a model)
  std::string adapter_digest;  // of the GGUF LoRA adapter ("" when none)
  bool blob_uploaded = false;  // false when the server already had it
  int requests = 0;            // HTTP requests sent, retries included
  std::string endpoint;
};

// One /api/create: the model from `from` (an existing Ollama model) or from `gguf_path` (uploaded),
// with `adapter_path` (a GGUF LoRA file, uploaded) as its ADAPTER when given.
struct OllamaCreate {
  std::string model_name;
  std::string from;          // "" = none
  std::string gguf_path;     // "" = none
  std::string adapter_path;  // "" = none
  OllamaTemplate tmpl;       // go_template "" = the base's own
  std::string system;        // "" = none
  int64_t num_ctx = 0;       // 0 = the base's own
};
OllamaResult create_ollama_model(const OllamaCreate& create, const OllamaOptions& options = {});

// create_ollama_model of one GGUF file.
OllamaResult register_with_ollama(const std::string& gguf_path, const std::string& model_name, const OllamaTemplate& t,
                                  int64_t num_ctx, const OllamaOptions& options = {});

}  // namespace bp
