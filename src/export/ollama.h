// Ollama integration for GGUF exports: a Modelfile (FROM, TEMPLATE, PARAMETER stop / num_ctx) and
// registration through Ollama's HTTP API at OLLAMA_HOST (default 127.0.0.1:11434):
//   1. HEAD /api/blobs/sha256:<digest>      200 = already there, 404 = upload it
//   2. POST /api/blobs/sha256:<digest>      body = the GGUF file; 201 Created (400 = digest mismatch)
//   3. POST /api/create  {"model", "files": {"<file>.gguf": "sha256:<digest>"}, "template",
//                         "parameters": {"stop": [...], "num_ctx": N}, "stream": false}
//                                           200 {"status": "success"}; errors are {"error": "..."}
// Each request is retried with exponential backoff on connection failures, timeouts, 429 and 5xx;
// other 4xx answers fail at once. Failure -> DEP_OLLAMA_REGISTRATION_FAILED (retryable), with
// `ollama serve` suggested when nothing listens.
//
// Chat templates (Jinja in tokenizer_config.json) become Go templates for the common families:
// ChatML (Qwen), Llama-3, Llama-2 / Mistral [INST], Gemma; anything else gets a plain
// "{{ .Prompt }}" template and `fallback = true`, so the caller can say so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bp {

struct OllamaTemplate {
  std::string family;  // "chatml", "llama3", "llama2", "mistral", "gemma", "none"
  std::string go_template;
  std::vector<std::string> stops;
  bool fallback = false;
};

// `end_tokens` (the tokenizer's eos strings) are added to the family's stop strings.
OllamaTemplate ollama_template_from_jinja(const std::string& chat_template, const std::vector<std::string>& end_tokens);

// The Modelfile text for `gguf_path` (written as given; pass an absolute path).
std::string make_modelfile(const std::string& gguf_path, const OllamaTemplate& t, int64_t num_ctx);

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
  std::string digest;          // "sha256:<hex>"
  bool blob_uploaded = false;  // false when the server already had it
  int requests = 0;            // HTTP requests sent, retries included
  std::string endpoint;
};

OllamaResult register_with_ollama(const std::string& gguf_path, const std::string& model_name, const OllamaTemplate& t,
                                  int64_t num_ctx, const OllamaOptions& options = {});

}  // namespace bp
