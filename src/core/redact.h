// Secret redaction applied to every log sink and every printed error (DESIGN.md "Logs").
//
// Replaced with ***: Bearer tokens, Hugging Face tokens (hf_...), OpenAI-style keys (sk-...),
// values of password=/passwd=/token=/api_key=/secret= (also "key": "value" JSON and key: value
// for passwords), the password in `--auth user:pass`, passwords in URLs (scheme://user:pass@host),
// and every value registered with redact_add_secret (e.g. the password of ui.auth).
#pragma once

#include <string>
#include <string_view>

namespace bp {

// The text with every secret replaced by ***. Returns the text unchanged when redaction is off.
std::string redact(std::string_view text);
// Redacts `secret` wherever it appears from now on (ignored when shorter than 4 characters, which
// the patterns above still cover in their usual forms). Thread-safe.
void redact_add_secret(std::string secret);
void redact_clear_secrets();
// security.redact_secrets (default on).
void set_redaction_enabled(bool on);

}  // namespace bp
