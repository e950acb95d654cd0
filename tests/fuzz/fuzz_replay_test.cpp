// Every libFuzzer target in tests/fuzz/, run in CI without libFuzzer: each target gets a seed corpus
// (real files from the repository, the adversarial shapes of issue 13) and a fixed number of
// deterministic mutations of it. scripts/test.sh runs this binary in the ASan + UBSan build, so an
// out-of-bounds read, an overflow or a crash fails CI the way libFuzzer would report it; a broken
// contract aborts inside the target. docs/fuzzing.md has the real libFuzzer runs.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "support/test_util.h"
#include "text/chat_template.h"

// The targets, each under its own name (each file defines LLVMFuzzerTestOneInput).
#define LLVMFuzzerTestOneInput fuzz_jsonl
#include "fuzz/jsonl_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_safetensors_header
#include "fuzz/safetensors_header_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_gguf_reader
#include "fuzz/gguf_reader_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_tokenizer_json
#include "fuzz/tokenizer_json_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_chat_template
#include "fuzz/chat_template_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_settings_toml
#include "fuzz/settings_toml_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_model_config
#include "fuzz/model_config_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_ollama_manifest
#include "fuzz/ollama_manifest_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_hub_json
#include "fuzz/hub_json_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_gguf_model
#include "fuzz/gguf_model_fuzz.cpp"  // NOLINT
#undef LLVMFuzzerTestOneInput
#include "fuzz/gguf_model_seeds.h"

namespace bp {
namespace {

using Target = int (*)(const uint8_t*, size_t);

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string repo_file(const std::string& rel) {
  return slurp(test::source_dir() + "/" + rel);
}

std::string deep(char open, char close, int n) {
  return std::string(static_cast<size_t>(n), open) + std::string(static_cast<size_t>(n), close);
}

// One random edit of the kinds that break parsers: bit flips, punctuation, digit runs (huge
// numbers and ids), deletions, duplications (repeated structure), truncation, nesting.
void mutate(std::string& s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const std::string interesting = "{}[](),:=\"'-0123456789eE.\\ \n%#|~\x00\xff\xc3";
  switch (rng() % 9) {
    case 0:
      if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:
      if (!s.empty()) s[pick(s.size())] = interesting[pick(interesting.size())];
      break;
    case 2: s.insert(pick(s.size() + 1), std::string(1 + pick(12), static_cast<char>('0' + pick(10)))); break;
    case 3: s.erase(pick(s.size() + 1), 1 + pick(32)); break;
    case 4: {
      const size_t at = pick(s.size() + 1);
      s.insert(pick(s.size() + 1), s.substr(at, 1 + pick(64)));
      break;
    }
    case 5: s.resize(pick(s.size() + 1)); break;
    case 6: s.insert(pick(s.size() + 1), std::string(1 + pick(300), "[{("[pick(3)])); break;
    case 7:
      if (s.size() >= 8) s.replace(pick(s.size() - 7), 8, std::string(8, static_cast<char>(rng())));
      break;
    default: s.insert(pick(s.size() + 1), 1, interesting[pick(interesting.size())]); break;
  }
}

// Runs the target on each seed and on `mutations` mutated copies (1-3 edits each, seeded).
void replay(Target target, const std::vector<std::string>& seeds, int mutations, uint64_t seed) {
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);  // dataset warnings and template fallbacks, thousands of them
  auto run = [&](const std::string& in) { target(reinterpret_cast<const uint8_t*>(in.data()), in.size()); };
  for (const std::string& s : seeds) run(s);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < mutations; ++i) {
    std::string s = seeds[static_cast<size_t>(rng() % seeds.size())];
    for (int e = 0, n = 1 + static_cast<int>(rng() % 3); e < n; ++e) mutate(s, rng);
    run(s);
  }
  spdlog::set_level(level);
}

TEST(FuzzReplay, JsonlRows) {
  std::vector<std::string> seeds = {
      repo_file("examples/quickstart_sharegpt.jsonl").substr(0, 3000),
      repo_file("examples/quickstart_alpaca.jsonl").substr(0, 3000),
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      "\n",
      R"([{"text": "one"}, {"text": "two"}] trailing)", "{\"text\": \"a\"}\n" + deep('[', ']', 5000) + "\n",
      "plain\n\nparagraphs of text\n",
      "\xEF\xBB\xBFinstruction,input,output\r\n\"a, \"\"b\"\"\",,\"two\nlines\"\r\nq,x,y\r\n",
      "prompt,completion,label\nQ,A,true\nQ2,B,False\n",
      // Tool calls (issue 43): arguments as a JSON string, a tool result, tools, ShareGPT's roles.
      R"({"messages": [{"role": "user", "content": "W?"}, {"role": "assistant", "content": null, "tool_calls": )"
      R"([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, {\"b\": 2}]}"}}]}, )"
      R"({"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "assistant", "content": "A", )"
      R"("reasoning_content": "R"}], "tools": [{"type": "function", "function": {"name": "f"}}]})"
      "\n",
      R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": )"
      R"("{\"name\": \"f\", \"arguments\": {}}"}, {"from": "observation", "value": "r"}, {"from": "gpt", )"
      R"("value": "A"}], "system": "S", "tools": "[{\"name\": \"f\"}]"})"
      "\n"};
  replay(fuzz_jsonl, seeds, 1500, 1);
}

TEST(FuzzReplay, SafetensorsHeader) {
  test::TempDir dir;
  const std::string path = dir.path + "/seed.safetensors";
  write_safetensors(path, {{"model.norm.weight", test::random_tensor({4}, 2).to(DType::BF16)},
                           {"lm_head.weight", test::random_tensor({3, 4}, 3)}});
  std::string nested = std::string(8, '\0') + deep('[', ']', 100000);
  const uint64_t n = nested.size() - 8;
  std::memcpy(nested.data(), &n, 8);
  replay(fuzz_safetensors_header, {slurp(path), nested}, 1500, 2);
}

TEST(FuzzReplay, GgufReader) {
  test::TempDir dir;
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("llama"));
  w.set("tokenizer.ggml.tokens", GGUFValue::strings({"a", "b", "<s>"}));
  w.set("test.f32s", GGUFValue::f32s({1.5f, -2.0f}));
  w.add_tensor(gguf_tensor_from("w", test::random_tensor({2, 32}, 1), GGMLType::Q8_0));
  w.add_tensor(gguf_tensor_from("n", test::random_tensor({3}, 2), GGMLType::F32));
  w.add_tensor(gguf_tensor_from("h", test::random_tensor({2, 4}, 3), GGMLType::F16));
  w.write(dir.path + "/seed.gguf");
  const std::string seed = slurp(dir.path + "/seed.gguf");
  replay(fuzz_gguf_reader, {seed}, 3000, 3);
}

// A GGUF image with one tensor of the given dims (ne order) and type F32, data zero-filled.
std::string gguf_with_tensor(const std::vector<uint64_t>& ne, uint64_t data_bytes) {
  std::string s = "GGUF";
  auto put = [&](auto v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{3});
  put(uint64_t{1});  // tensors
  put(uint64_t{0});  // metadata keys
  put(uint64_t{1});
  s += "t";
  put(static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) put(d);
  put(uint32_t{0});  // F32
  put(uint64_t{0});  // offset
  s.resize((s.size() + 31) / 32 * 32 + data_bytes, '\0');
  return s;
}

TEST(FuzzReplay, GgufElementCountOverflowAndZeroSizeTensors) {
  // 2^40 per dimension passes the per-dimension check; the product overflowed int64 (UBSan).
  const std::string huge = gguf_with_tensor({uint64_t{1} << 40, uint64_t{1} << 40, uint64_t{1} << 40, 4}, 64);
  try {
    GGUFReader r(reinterpret_cast<const uint8_t*>(huge.data()), huge.size(), "huge.gguf");
    FAIL() << "accepted a tensor of 2^122 elements";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("more elements than"), std::string::npos) << e.what();
  }
  // A zero-size tensor parses and dequantizes to nothing (it once reached memcpy(NULL, ..., 0)).
  const std::string empty = gguf_with_tensor({0, 3}, 0);
  GGUFReader r(reinterpret_cast<const uint8_t*>(empty.data()), empty.size(), "empty.gguf");
  ASSERT_EQ(r.tensors().size(), 1u);
  EXPECT_EQ(r.tensors()[0].numel(), 0);
  EXPECT_TRUE(r.dequantize(r.tensors()[0]).empty());
  replay(fuzz_gguf_reader, {huge, empty}, 300, 8);
}

TEST(FuzzReplay, TokenizerJson) {
  // A small byte-level BPE file (the repository's tiny model's is 13 KB: fewer bytes, more edits per byte).
  const std::string small = R"({"version": "1.0", "added_tokens": [{"id": 5, "content": "<s>", "special": true}],
    "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "He": 4}, "merges": ["H e"]}})";
  replay(fuzz_tokenizer_json, {small, repo_file("models/tiny-chat/tokenizer.json"), deep('{', '}', 3)}, 600, 4);
}

TEST(FuzzReplay, ChatTemplates) {
  const nlohmann::json cfg = nlohmann::json::parse(repo_file("models/tiny-chat/tokenizer_config.json"));
  std::vector<std::string> seeds = {
      kChatMLTemplate,
      "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]"
      "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
      "{% set x = namespace(n=0) %}{% for i in range(3) %}{% set x.n = x.n + i %}{% endfor %}{{ x.n }}"
      "{{ messages | length }}{{ 'a,b' .split(',') | join('-') }}{{ {'k': [1, 2]} | tojson }}"};
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) seeds.push_back(cfg["chat_template"]);
  replay(fuzz_chat_template, seeds, 1500, 5);
}

TEST(FuzzReplay, SettingsToml) {
  const std::vector<std::string> seeds = {
      "[training]\nlr = 0.0002\nsteps = 10\nmicro_batch_size = \"auto\"\n[lora]\nr = 8\nuse_rslora = true\n"
      "[data]\nholdout = 0.1\n[limits]\nmax_config_bytes = \"1M\"\n",
      "a = [[[1]]]\n[x.y]\nz = { q = 1 }\n"};
  replay(fuzz_settings_toml, seeds, 2000, 6);
}

TEST(FuzzReplay, ModelConfigAndMemoryPlan) {
  const std::string cfg = repo_file("models/tiny-chat/config.json");
  std::string huge = cfg;
  huge.replace(huge.find("\"head_dim\": 32"), 14, "\"head_dim\": 4194304");
  replay(fuzz_model_config, {cfg, huge, deep('[', ']', 100000)}, 1500, 7);
}

TEST(FuzzReplay, OllamaManifest) {
  const std::string hex(64, 'a');
  const std::string good = R"({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:)" +
                           hex + R"(", "size": 485},
    "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:)" +
                           hex + R"(", "size": 1000},
               {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:)" +
                           hex + R"(", "size": 13}]})";
  const std::string wrong_types = R"({"layers": [{"mediaType": 7, "digest": ["sha256:../../x"], "size": "big"}]})";
  replay(fuzz_ollama_manifest, {good, wrong_types, R"({"layers": {}})", deep('[', ']', 100000)}, 1500, 9);
}

TEST(FuzzReplay, HubJsonAnswers) {
  const std::string info = R"({"id": "org/tiny", "sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [
    {"rfilename": "config.json"}, {"rfilename": "model.safetensors.index.json"}, {"rfilename": "onnx/model.onnx"}]})";
  const std::string index = R"({"metadata": {"total_size": 1000}, "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}})";
  const std::string hostile = R"({"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [{"rfilename": "/a"}],
    "weight_map": {"x": "../../x/evil.safetensors", "y": "a\\b", "z": 3}})";
  replay(fuzz_hub_json, {info, index, hostile, deep('{', '}', 3), deep('[', ']', 100000)}, 1500, 10);
}

TEST(FuzzReplay, GgufModel) {
  const std::vector<std::string> seeds = test::gguf_model_seeds();
  for (const std::string& s : seeds) {  // every seed goes all the way to a ModelConfig
    const GGUFReader r(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "seed.gguf");
    EXPECT_GE(ModelConfig::from_json(hub::gguf_model_files(r, "seed.gguf").config, "seed").vocab_size, 6);
  }
  replay(fuzz_gguf_model, seeds, 1500, 9);
}

}  // namespace
}  // namespace bp
