// A GGUF file as a model folder (see gguf_source.h).
#include "hub/gguf_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "hub/gguf_rope.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/sha256.h"

namespace bp::hub {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[gguf] {}: {}", path, what));
}

struct Vocab {
  std::string model, pre;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  json merges;
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = true;
  std::optional<std::string> chat_template;
};

// Phi-3 as convert_hf_to_gguf.py's Phi3MiniModel writes it: rope.dimension_count the rotated dims
// (partial rotary), LongRoPE's factors in rope_factors_long/short.weight with
// rope.scaling.original_context_length and rope.scaling.attn_factor (attention.sliding_window is
// add_sliding_window's, as for every architecture).
void phi3_rope_from_gguf(const GGUFReader& r, const std::string& path, int64_t head_dim, json& c) {
  const int64_t rot = r.get_int("phi3.rope.dimension_count").value_or(head_dim);
  if (rot < 2 || rot > head_dim || rot % 2 != 0)
    fail(path, fmt::format("metadata phi3.rope.dimension_count is {}; it must be even and in [2, head_dim {}]", rot,
                           head_dim));
  if (rot != head_dim) c["partial_rotary_factor"] = static_cast<double>(rot) / static_cast<double>(head_dim);
  const GGUFTensorInfo* lf = r.find_tensor("rope_factors_long.weight");
  const GGUFTensorInfo* sf = r.find_tensor("rope_factors_short.weight");
  if (!lf && !sf) return;
  if (!lf || !sf || lf->numel() != rot / 2 || sf->numel() != rot / 2)
    fail(path, fmt::format("rope_factors_long.weight and rope_factors_short.weight must both hold "
                           "rope.dimension_count / 2 = {} values",
                           rot / 2));
  const std::optional<int64_t> orig = r.get_int("phi3.rope.scaling.original_context_length");
  if (!orig || *orig < 1) fail(path, "metadata phi3.rope.scaling.original_context_length is missing or not positive");
  c["original_max_position_embeddings"] = *orig;
  c["rope_scaling"] = {{"type", "longrope"}, {"long_factor", r.dequantize(*lf)}, {"short_factor", r.dequantize(*sf)}};
  if (const std::optional<double> af = r.get_number("phi3.rope.scaling.attn_factor"))
    c["rope_scaling"]["attention_factor"] = *af;
}

// {arch}.attention.sliding_window (llama.cpp's key) as config.json says it: a llama file with a
// window is Mistral's (which llama.cpp converts as llama), qwen2/qwen3 (and smollm3, which refuses
// it) turn use_sliding_window on. {arch}.attention.sliding_window_pattern (one bool per layer) picks the windowed
// layers; without it every layer has the window.
void add_sliding_window(const GGUFReader& r, const std::string& path, const std::string& arch, int64_t layers,
                        json& c) {
  const std::string key = arch + ".attention.sliding_window", pattern_key = arch + ".attention.sliding_window_pattern";
  const std::optional<int64_t> window = r.get_int(key);
  if (!window || *window == 0) return;
  if (*window < 0) fail(path, fmt::format("metadata {} is {}; it must be at least 0", key, *window));
  json types = json::array();
  if (const GGUFValue* p = r.find(pattern_key)) {
    if (p->type != GGUFValueType::ARRAY || p->elem_type != GGUFValueType::BOOL ||
        static_cast<int64_t>(p->value.size()) != layers)
      fail(path, fmt::format("metadata {} must be an array of {}.block_count = {} bools", pattern_key, arch, layers));
    for (const json& b : p->value) types.push_back(b.get<bool>() ? "sliding_attention" : "full_attention");
  } else {
    for (int64_t l = 0; l < layers; ++l) types.push_back("sliding_attention");
  }
  if (arch == "llama") {
    c["architectures"] = {"MistralForCausalLM"};
    c["model_type"] = "mistral";
  } else if (arch != "phi3") {  // Phi3Config has no switch: its window applies whenever given
    c["use_sliding_window"] = true;
  }
  c["sliding_window"] = *window;
  c["layer_types"] = types;
}

// Gemma in llama.cpp (llama-model.cpp LLM_ARCH_GEMMA2 / LLM_ARCH_GEMMA3): the sliding window and
// Gemma 2's soft-caps from metadata; the layer pattern (Gemma 2 every other layer from layer 0,
// Gemma 3 five sliding then one global), the local RoPE base (10000) and the attention scale are
// the architecture's: 1/sqrt(head_dim), except the 27B models' 1/sqrt(hidden/heads) (query_pre_attn_scalar).
void gemma_config_from_gguf(const GGUFReader& r, const std::string& path, const std::string& arch, json& c) {
  c.erase("hidden_act");
  c["hidden_activation"] = "gelu_pytorch_tanh";
  const int64_t hidden = c["hidden_size"], heads = c["num_attention_heads"], layers = c["num_hidden_layers"];
  const bool big = (arch == "gemma2" && layers == 46) || (arch == "gemma3" && layers == 62);  // the 27B models
  c["query_pre_attn_scalar"] = big ? hidden / heads : c["head_dim"].get<int64_t>();
  if (!c.contains("sliding_window"))  // add_sliding_window's, from {arch}.attention.sliding_window
    fail(path, fmt::format("metadata {}.attention.sliding_window is missing or 0", arch));
  c.erase("use_sliding_window");
  // llama.cpp's own files carry no per-layer pattern: the architecture's (not every layer windowed).
  if (!r.find(arch + ".attention.sliding_window_pattern")) c.erase("layer_types");
  auto cap = [&](const char* key) {
    const std::optional<double> v = r.get_number(arch + "." + key);
    if (v && !(*v > 0)) fail(path, fmt::format("metadata {}.{} is {}; it must be greater than 0", arch, key, *v));
    return v ? json(*v) : json(nullptr);
  };
  c["attn_logit_softcapping"] = cap("attn_logit_softcapping");
  c["final_logit_softcapping"] = cap("final_logit_softcapping");
  if (arch == "gemma3") {
    c["rope_local_base_freq"] = 10000.0;
    c["sliding_window_pattern"] = 6;
    if (r.get_string(arch + ".rope.scaling.type").value_or("") == "linear") {
      const std::optional<double> f = r.get_number(arch + ".rope.scaling.factor");
      if (!f || !(*f > 0)) fail(path, fmt::format("metadata {}.rope.scaling.factor is missing or not > 0", arch));
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", *f}};
    }
  }
}

// Mixture-of-Experts in llama.cpp (llama-arch.cpp, models/qwen3moe.cpp, convert_hf_to_gguf.py):
// {arch}.expert_count and {arch}.expert_used_count; qwen3moe's expert width is
// expert_feed_forward_length (llama.cpp's fallback: feed_forward_length / expert_used_count); a
// llama file with experts is a Mixtral (experts of feed_forward_length). llama.cpp makes every
// layer sparse and always renormalises the top-k weights (norm_topk_prob true). A router tensor
// without expert_count, or counts out of range, is refused naming the key; the tensors' shapes are
// checked against these when the weights load (model/loader_gguf.cpp).
void moe_config_from_gguf(const GGUFReader& r, const std::string& path, const std::string& arch, json& c) {
  const std::string count_key = arch + ".expert_count", used_key = arch + ".expert_used_count";
  const std::optional<int64_t> experts = r.get_int(count_key);
  const bool router = r.find_tensor("blk.0.ffn_gate_inp.weight") != nullptr;
  if (arch != "qwen3moe" && (!experts || *experts == 0)) {
    if (router)
      fail(path, fmt::format("tensor blk.0.ffn_gate_inp.weight (a Mixture-of-Experts router) is present but metadata "
                             "{} is {}",
                             count_key, experts ? "0" : "missing"));
    return;
  }
  if (arch != "qwen3moe" && arch != "llama")
    fail(path, fmt::format("metadata {} is {}: backprop reads Mixture-of-Experts GGUF files of qwen3moe and llama "
                           "(Mixtral) only",
                           count_key, *experts));
  if (!experts || *experts < 1)
    fail(path, fmt::format("metadata {} is {}; a Mixture-of-Experts model needs at least 1 expert", count_key,
                           experts ? std::to_string(*experts) : std::string("missing")));
  const std::optional<int64_t> used = r.get_int(used_key);
  if (!used || *used < 1 || *used > *experts)
    fail(path, fmt::format("metadata {} is {}; it must be in [1, {} = {}]", used_key,
                           used ? std::to_string(*used) : std::string("missing"), count_key, *experts));
  c["num_experts_per_tok"] = *used;
  if (arch == "qwen3moe") {
    const std::string ff_key = arch + ".expert_feed_forward_length";
    const std::optional<int64_t> ff = r.get_int(ff_key);
    if (ff && *ff < 1) fail(path, fmt::format("metadata {} is {}; it must be at least 1", ff_key, *ff));
    const int64_t width = ff ? *ff : c["intermediate_size"].get<int64_t>() / *used;
    if (width < 1)
      fail(path, fmt::format("metadata {} is missing and feed_forward_length / expert_used_count is 0", ff_key));
    c["num_experts"] = *experts;
    c["moe_intermediate_size"] = width;
    c["norm_topk_prob"] = true;
  } else {  // a window made add_sliding_window call it Mistral: Mixtral has the same key
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["num_local_experts"] = *experts;
  }
}

json config_from_gguf(const GGUFReader& r, const std::string& path) {
  const std::string arch = r.get_string("general.architecture").value_or("");
  static const std::map<std::string, std::pair<std::string, std::string>> kArch = {
      {"llama", {"LlamaForCausalLM", "llama"}},         {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
      {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},         {"phi3", {"Phi3ForCausalLM", "phi3"}},
      {"smollm3", {"SmolLM3ForCausalLM", "smollm3"}},   {"gemma2", {"Gemma2ForCausalLM", "gemma2"}},
      {"gemma3", {"Gemma3ForCausalLM", "gemma3_text"}}, {"qwen3moe", {"Qwen3MoeForCausalLM", "qwen3_moe"}}};
  auto it = kArch.find(arch);
  if (it == kArch.end())
    fail(path,
         fmt::format(
             "general.architecture is '{}'; backprop reads llama (Mixtral too), qwen2, qwen3, qwen3moe, phi3, smollm3, "
             "gemma2 and gemma3 GGUF files",
             arch));
  // Every size is checked before any arithmetic uses it (a head count of 0 once divided by zero).
  auto size = [&](const std::string& key, std::optional<int64_t> fallback) {
    const std::optional<int64_t> v = r.get_int(arch + "." + key);
    if (!v && !fallback) fail(path, fmt::format("metadata {}.{} is missing", arch, key));
    if (v && *v < 1) fail(path, fmt::format("metadata {}.{} is {}; it must be at least 1", arch, key, *v));
    return v.value_or(*fallback);
  };
  auto positive = [&](const std::string& key, std::optional<double> fallback) {
    const std::optional<double> v = r.get_number(arch + "." + key);
    if (!v && !fallback) fail(path, fmt::format("metadata {}.{} is missing", arch, key));
    if (v && !(*v > 0)) fail(path, fmt::format("metadata {}.{} is {}; it must be greater than 0", arch, key, *v));
    return v.value_or(*fallback);
  };
  const int64_t layers = size("block_count", {}), hidden = size("embedding_length", {});
  const int64_t intermediate = size("feed_forward_length", {}), heads = size("attention.head_count", {});
  const int64_t kv_heads = size("attention.head_count_kv", heads);
  if (heads % kv_heads != 0)
    fail(path, fmt::format("metadata {0}.attention.head_count ({1}) is not a multiple of "
                           "{0}.attention.head_count_kv ({2})",
                           arch, heads, kv_heads));
  if (!r.find(arch + ".attention.key_length") && hidden % heads != 0)
    fail(path, fmt::format("metadata {0}.embedding_length ({1}) is not divisible by {0}.attention.head_count ({2}) "
                           "and {0}.attention.key_length is not given",
                           arch, hidden, heads));
  const int64_t head_dim = size("attention.key_length", hidden / heads);
  if (head_dim < 2 || head_dim % 2 != 0)
    fail(path, fmt::format("the head dimension ({}.attention.key_length, or embedding_length / head_count) is {}; "
                           "rotary embeddings need an even number of at least 2",
                           arch, head_dim));
  const GGUFTensorInfo* embd = r.find_tensor("token_embd.weight");
  if (!embd) fail(path, "tensor token_embd.weight is missing");
  if (embd->shape.size() != 2 || embd->shape[0] < 1 || embd->shape[1] != hidden)
    fail(path, fmt::format("tensor token_embd.weight has shape [{}]; it must be [vocabulary size, {}.embedding_length "
                           "= {}]",
                           fmt::join(embd->shape, ", "), arch, hidden));
  const int64_t vocab = embd->shape[0];
  const double theta = positive("rope.freq_base", 10000.0);
  json c = {{"architectures", {it->second.first}},
            {"model_type", it->second.second},
            {"hidden_size", hidden},
            {"intermediate_size", intermediate},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"head_dim", head_dim},
            {"vocab_size", vocab},
            {"max_position_embeddings", size("context_length", 2048)},
            {"rms_norm_eps", positive("attention.layer_norm_rms_epsilon", {})},
            {"rope_theta", theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", r.find_tensor("output.weight") == nullptr},
            {"attention_bias", arch == "llama" && r.find_tensor("blk.0.attn_q.bias") != nullptr},
            {"torch_dtype", embd->type == GGMLType::BF16  ? "bfloat16"
                            : embd->type == GGMLType::F32 ? "float32"
                                                          : "float16"},
            {"backprop_gguf_file", fs::absolute(path).lexically_normal().string()}};
  add_sliding_window(r, path, arch, layers, c);
  // Llama-3.1/3.2: rope scaling lives in rope_freqs.weight only (hub/gguf_rope.h).
  if (json rs = llama3_rope_scaling_from_gguf(r, path, theta, head_dim); !rs.is_null()) c["rope_scaling"] = rs;
  if (arch == "phi3") phi3_rope_from_gguf(r, path, head_dim, c);
  // llama.cpp's smollm3 takes RoPE off every 4th layer (n_no_rope_layer_step = 4), with no key for it.
  if (arch == "smollm3") c["no_rope_layer_interval"] = 4;
  if (arch == "gemma2" || arch == "gemma3") gemma_config_from_gguf(r, path, arch, c);
  moe_config_from_gguf(r, path, arch, c);
  return c;
}

// Pre-tokenizer regexes of the byte-level vocabularies (the ones their tokenizer.json files use).
std::string byte_level_regex(const std::string& pre) {
  if (pre == "llama-bpe" || pre == "llama3")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre == "qwen2")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

// transformers' SentencePieceExtractor: every split of a piece into two vocabulary pieces is a
// merge; merges are ordered by the joined piece's score (highest first), ties by vocabulary order.
json spm_merges(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                const std::vector<int32_t>& types) {
  std::unordered_map<std::string, int32_t> id;
  for (size_t i = 0; i < tokens.size(); ++i) id.emplace(tokens[i], static_cast<int32_t>(i));
  struct Merge {
    float score;
    int32_t piece, left, right;
  };
  std::vector<Merge> merges;
  for (size_t p = 0; p < tokens.size(); ++p) {
    if (types[p] != 1 && types[p] != 4) continue;  // normal and user pieces only
    const std::string& s = tokens[p];
    std::vector<Merge> local;
    for (size_t k = 1; k < s.size(); ++k) {
      if ((static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) continue;  // split on characters
      auto l = id.find(s.substr(0, k)), r = id.find(s.substr(k));
      if (l != id.end() && r != id.end()) local.push_back({scores[p], static_cast<int32_t>(p), l->second, r->second});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::tie(a.left, a.right) < std::tie(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  json out = json::array();
  for (const auto& m : merges)
    out.push_back(tokens[static_cast<size_t>(m.left)] + " " + tokens[static_cast<size_t>(m.right)]);
  return out;
}

json special_token_processor(const std::string& bos, int32_t bos_id) {
  return {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
}

// Every value is read through the reader's typed getters (io/gguf_reader.h): a key of the wrong type,
// a token that is not UTF-8 or a special token id outside the vocabulary is refused naming the key.
Vocab read_vocab(const GGUFReader& r, const std::string& path) {
  Vocab v;
  v.model = r.get_string("tokenizer.ggml.model").value_or("");
  v.pre = r.get_string("tokenizer.ggml.pre").value_or("default");
  if (v.model != "gpt2" && v.model != "llama")
    fail(path, fmt::format("tokenizer.ggml.model is '{}'; backprop reads 'gpt2' (byte-level BPE) and 'llama' "
                           "(SentencePiece BPE) vocabularies",
                           v.model));
  v.tokens = r.get_strings("tokenizer.ggml.tokens").value_or(std::vector<std::string>{});
  if (v.tokens.empty()) fail(path, "it has no tokenizer.ggml.tokens (the vocabulary)");
  const size_t n = v.tokens.size();
  auto per_token = [&](const char* key, auto values) {
    if (values && values->size() != n)
      fail(path, fmt::format("metadata '{}' has {} values for {} tokens", key, values->size(), n));
    return values;
  };
  v.scores.assign(n, 0.0f);
  if (const auto s = per_token("tokenizer.ggml.scores", r.get_numbers("tokenizer.ggml.scores")))
    for (size_t i = 0; i < n; ++i) {
      if (std::abs((*s)[i]) > std::numeric_limits<float>::max())
        fail(path, fmt::format("metadata 'tokenizer.ggml.scores' element {} is {}, past a float's range", i, (*s)[i]));
      v.scores[i] = static_cast<float>((*s)[i]);
    }
  v.types.assign(n, 1);
  if (const auto t = per_token("tokenizer.ggml.token_type", r.get_ints("tokenizer.ggml.token_type")))
    for (size_t i = 0; i < n; ++i) {
      if ((*t)[i] < 0 || (*t)[i] > 6)  // llama.cpp's token types: 0 undefined ... 6 byte
        fail(path,
             fmt::format("metadata 'tokenizer.ggml.token_type' element {} is {}; token types are 0 to 6", i, (*t)[i]));
      v.types[i] = static_cast<int32_t>((*t)[i]);
    }
  if (auto m = r.get_strings("tokenizer.ggml.merges")) v.merges = std::move(*m);
  auto token_id = [&](const char* key) {
    const std::optional<int64_t> id = r.get_int(key);
    if (id && (*id < 0 || *id >= static_cast<int64_t>(n)))
      fail(path,
           fmt::format("metadata '{}' is {}, but the vocabulary has {} tokens (ids 0 to {})", key, *id, n, n - 1));
    return id ? static_cast<int32_t>(*id) : -1;
  };
  v.bos = token_id("tokenizer.ggml.bos_token_id");
  v.eos = token_id("tokenizer.ggml.eos_token_id");
  v.unk = token_id("tokenizer.ggml.unknown_token_id");
  v.add_bos = r.get_bool("tokenizer.ggml.add_bos_token").value_or(v.model == "llama");
  v.add_eos = r.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  v.add_space_prefix = r.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  v.chat_template = r.get_string("tokenizer.chat_template");
  return v;
}

json tokenizer_json(const Vocab& v) {
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    vocab[v.tokens[i]] = i;
    const int32_t t = v.types[i];
    if (t == 3 || t == 4 || (t == 2 && v.model == "llama"))  // control, user-defined, unknown
      added.push_back({{"id", i},
                       {"content", v.tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", t == 4},
                       {"special", t != 4}});
  }
  auto name = [&](int32_t id) {
    return id >= 0 && id < static_cast<int32_t>(v.tokens.size()) ? v.tokens[static_cast<size_t>(id)] : std::string();
  };
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"vocab", vocab}};
  if (v.model == "gpt2") {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", byte_level_regex(v.pre)}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    model.update({{"unk_token", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", v.pre == "llama-bpe"},
                  {"merges", v.merges.is_array() ? v.merges : json::array()}});
  } else {
    json norm = json::array();
    if (v.add_space_prefix) norm.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    j["pre_tokenizer"] = nullptr;
    json dec = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}}};
    if (v.add_space_prefix) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
    model.update({{"unk_token", v.unk >= 0 ? json(name(v.unk)) : json(nullptr)},
                  {"fuse_unk", true},
                  {"byte_fallback", true},
                  {"ignore_merges", false},
                  {"merges", spm_merges(v.tokens, v.scores, v.types)}});
  }
  j["post_processor"] = v.add_bos && v.bos >= 0 ? special_token_processor(name(v.bos), v.bos) : json(nullptr);
  j["model"] = model;
  return j;
}

json tokenizer_config(const Vocab& v) {
  auto name = [&](int32_t id) {
    return id >= 0 && id < static_cast<int32_t>(v.tokens.size()) ? json(v.tokens[static_cast<size_t>(id)])
                                                                 : json(nullptr);
  };
  json c = {{"bos_token", name(v.bos)},   {"eos_token", name(v.eos)},   {"unk_token", name(v.unk)},
            {"add_bos_token", v.add_bos}, {"add_eos_token", v.add_eos}, {"clean_up_tokenization_spaces", false}};
  if (v.chat_template) c["chat_template"] = *v.chat_template;
  return c;
}

}  // namespace

GGUFModelFiles gguf_model_files(const GGUFReader& r, const std::string& path) {
  GGUFModelFiles f;
  f.config = config_from_gguf(r, path);
  const Vocab v = read_vocab(r, path);
  if (const auto rows = f.config["vocab_size"].get<int64_t>(); static_cast<int64_t>(v.tokens.size()) > rows)
    fail(path, fmt::format("{} tokens for an embedding of {} rows", v.tokens.size(), rows));
  if (v.bos >= 0) f.config["bos_token_id"] = v.bos;
  if (v.eos >= 0) f.config["eos_token_id"] = v.eos;
  f.tokenizer = tokenizer_json(v);
  f.tokenizer_config = tokenizer_config(v);
  return f;
}

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::string(magic, 4) == "GGUF";
}

void check_non_gguf_model_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(64, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  std::string name = fs::path(path).filename().string();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const size_t first = head.find_first_not_of(" \t\r\n");
  const bool gguf_name = name.size() >= 5 && name.compare(name.size() - 5, 5, ".gguf") == 0;
  if (!gguf_name && first != std::string::npos && head[first] == '{') return;  // JSON: a config.json
  std::string magic;
  for (size_t i = 0; i < std::min<size_t>(head.size(), 4); ++i)
    magic += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(head[i]));
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
              fmt::format("[gguf] {}: not a GGUF file (magic {}; a GGUF file begins with 47 47 55 46, \"GGUF\")", path,
                          head.empty() ? "missing: the file is empty" : magic))
      .with_suggestion(
          "Pass a GGUF file, a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a hub "
          "name; a GGUF file that fails this check is damaged or incomplete (download it again).");
}

std::string gguf_model_folder(const std::string& gguf_path, const std::string& derived_dir) {
  const fs::path abs = fs::absolute(gguf_path).lexically_normal();
  const auto mtime = fs::last_write_time(abs).time_since_epoch().count();
  const std::string key =
      sha256_hex(fmt::format("{}\n{}\n{}\nv2", abs.string(), fs::file_size(abs), mtime)).substr(0, 24);
  const fs::path dir = fs::path(derived_dir) / key;
  if (fs::is_regular_file(dir / "config.json") && fs::is_regular_file(dir / "tokenizer_config.json"))
    return dir.string();
  const GGUFModelFiles files = gguf_model_files(GGUFReader(abs.string()), abs.string());
  fs::create_directories(dir);
  write_file_atomic((dir / "tokenizer.json").string(), files.tokenizer.dump());
  write_file_atomic((dir / "config.json").string(), files.config.dump(2));
  write_file_atomic((dir / "tokenizer_config.json").string(), files.tokenizer_config.dump(2));  // written last
  return dir.string();
}

}  // namespace bp::hub
