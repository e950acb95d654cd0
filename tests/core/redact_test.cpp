// Redaction of secrets: each pattern, registered secrets, and that ordinary text is left alone.
#include "core/redact.h"

#include <gtest/gtest.h>

namespace bp {
namespace {

struct Case {
  std::string in, secret, must_keep;
};

TEST(Redact, EveryPatternIsMasked) {
  const Case cases[] = {
      {"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "eyJhbGciOiJIUzI1NiJ9", "Authorization: Bearer ***"},
      {"token hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 used", "hf_AbCdEfGh", "hf_***"},
      {"key=sk-proj-abcDEF123456ghiJKL end", "abcDEF123456", "sk-***"},
      {"url?user=bob&password=hunter22&x=1", "hunter22", "password=***&x=1"},
      {"password: hunter22 next", "hunter22", "password: ***"},
      {"token=abcdef987654", "abcdef987654", "token=***"},
      {"access_token=zzzz99998888", "zzzz99998888", "access_token=***"},
      {R"({"password": "hunter22", "n": 3})", "hunter22", R"("n": 3)"},
      {R"({"api_key":"k-123456789"})", "k-123456789", "api_key"},
      {"backprop ui --auth alice:hunter22 --port 1", "hunter22", "--auth alice:*** --port 1"},
      {"backprop ui --auth=alice:hunter22", "hunter22", "--auth=alice:***"},
      {"push to https://bob:hunter22@example.com/x", "hunter22", "https://bob:***@example.com/x"},
  };
  for (const auto& c : cases) {
    std::string out = redact(c.in);
    EXPECT_EQ(out.find(c.secret), std::string::npos) << c.in << " -> " << out;
    EXPECT_NE(out.find(c.must_keep), std::string::npos) << c.in << " -> " << out;
  }
}

TEST(Redact, OrdinaryTextIsUnchanged) {
  for (std::string s : {"step 10/100 loss 2.3456 lr 2e-4 tokens/s 1234", "max_tokens: 100, tokens=", "hf_ab",
                        "the next token: 42", "task-1 sk-1", "http://127.0.0.1:11434/api", "Bearer"})
    EXPECT_EQ(redact(s), s);
}

TEST(Redact, RegisteredSecretsAndSwitch) {
  redact_add_secret("Zebra-Crossing-77");
  redact_add_secret("ab");  // too short to register
  EXPECT_EQ(redact("value Zebra-Crossing-77 here"), "value *** here");
  EXPECT_EQ(redact("ab cab"), "ab cab");
  set_redaction_enabled(false);
  EXPECT_EQ(redact("password=hunter22"), "password=hunter22");
  set_redaction_enabled(true);
  redact_clear_secrets();
  EXPECT_EQ(redact("value Zebra-Crossing-77 here"), "value Zebra-Crossing-77 here");
}

TEST(Redact, LongInputIsLinear) {
  std::string big(2'000'000, 'a');
  big += " password=secret123";
  std::string out = redact(big);
  EXPECT_EQ(out.substr(out.size() - 12), "password=***");
}

}  // namespace
}  // namespace bp
