// Seeds of gguf_model_fuzz (tests/fuzz/gguf_model_fuzz.cpp): GGUF images written by our own
// GGUFWriter that go all the way to a ModelConfig and a tokenizer, small enough that mutations
// mostly hit metadata: a SentencePiece ("llama") vocabulary with Llama-3 rope_freqs, a byte-level
// BPE ("gpt2") one with merges and an explicit key_length, and stories260K's real metadata from
// export_gguf with its embedding as q8_0 blocks. fuzz_replay_test.cpp replays them in CI;
// BP_FUZZ_SEEDS_OUT=DIR writes them there as a corpus for libFuzzer (docs/fuzzing.md).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "export/gguf_export.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "model/loader.h"
#include "support/test_util.h"

namespace bp::test {

inline void gguf_seed_hparams(GGUFWriter& w, const std::string& arch, uint32_t hidden, uint32_t heads, uint32_t kv) {
  w.set("general.architecture", GGUFValue::str(arch));
  w.set(arch + ".block_count", GGUFValue::u32(1));
  w.set(arch + ".context_length", GGUFValue::u32(64));
  w.set(arch + ".embedding_length", GGUFValue::u32(hidden));
  w.set(arch + ".feed_forward_length", GGUFValue::u32(16));
  w.set(arch + ".attention.head_count", GGUFValue::u32(heads));
  w.set(arch + ".attention.head_count_kv", GGUFValue::u32(kv));
  w.set(arch + ".rope.freq_base", GGUFValue::f32(500000.0f));
  w.set(arch + ".attention.layer_norm_rms_epsilon", GGUFValue::f32(1e-5f));
}

inline std::string gguf_seed_image(const GGUFWriter& w, const std::string& name) {
  TempDir dir;
  w.write(dir.path + "/" + name);
  return read_file(dir.path + "/" + name);
}

inline std::vector<std::string> gguf_model_seeds() {
  std::vector<std::string> seeds;
  {  // SentencePiece BPE, head_dim 8 with four Llama-3 rope divisors
    GGUFWriter w;
    gguf_seed_hparams(w, "llama", 16, 2, 1);
    const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>",    "<0x0A>",   "\u2581",    "a",
                                             "b",     "ab",  "\u2581a", "\u2581ab", "<|im_end|>"};
    w.set("tokenizer.ggml.model", GGUFValue::str("llama"));
    w.set("tokenizer.ggml.tokens", GGUFValue::strings(tokens));
    w.set("tokenizer.ggml.scores", GGUFValue::f32s({0, 0, 0, 0, -1, -2, -3, -4, -5, -6, 0}));
    w.set("tokenizer.ggml.token_type", GGUFValue::i32s({2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 4}));
    w.set("tokenizer.ggml.bos_token_id", GGUFValue::u32(1));
    w.set("tokenizer.ggml.eos_token_id", GGUFValue::u32(2));
    w.set("tokenizer.ggml.unknown_token_id", GGUFValue::u32(0));
    w.set("tokenizer.ggml.add_bos_token", GGUFValue::boolean(true));
    w.set("tokenizer.chat_template", GGUFValue::str("{% for m in messages %}{{ m['content'] }}{% endfor %}"));
    w.add_tensor(gguf_tensor_from("token_embd.weight", random_tensor({11, 16}, 1), GGMLType::F32));
    w.add_tensor(gguf_tensor_from("rope_freqs.weight", Tensor::from_vector(std::vector<float>{1, 1, 3, 8}, Shape{4}),
                                  GGMLType::F32));
    seeds.push_back(gguf_seed_image(w, "spm.gguf"));
  }
  {  // byte-level BPE with merges, key_length given (not hidden / heads), an output head
    GGUFWriter w;
    gguf_seed_hparams(w, "qwen2", 8, 2, 2);
    w.set("qwen2.attention.key_length", GGUFValue::u32(6));
    w.set("tokenizer.ggml.model", GGUFValue::str("gpt2"));
    w.set("tokenizer.ggml.pre", GGUFValue::str("qwen2"));
    w.set("tokenizer.ggml.tokens", GGUFValue::strings({"a", "b", "ab", "\u0120", "\u0120a", "<|endoftext|>"}));
    w.set("tokenizer.ggml.token_type", GGUFValue::i32s({1, 1, 1, 1, 1, 3}));
    w.set("tokenizer.ggml.merges", GGUFValue::strings({"a b", "\u0120 a"}));
    w.set("tokenizer.ggml.eos_token_id", GGUFValue::u32(5));
    w.add_tensor(gguf_tensor_from("token_embd.weight", random_tensor({6, 8}, 2), GGMLType::F16));
    w.add_tensor(gguf_tensor_from("output.weight", random_tensor({6, 8}, 3), GGMLType::F32));
    seeds.push_back(gguf_seed_image(w, "bpe.gguf"));
  }
  {  // stories260K's real metadata (512 SentencePiece tokens), embedding as q8_0
    TempDir dir;
    const std::string stories = shared_dir() + "/models/stories260K";
    export_gguf(load_model(stories), stories, GGUFQuant::F32, dir.path + "/stories.gguf");
    const GGUFReader r(dir.path + "/stories.gguf");
    GGUFWriter w;
    for (const auto& [k, v] : r.metadata()) w.set(k, v);
    w.add_tensor(gguf_tensor_from("token_embd.weight", random_tensor({512, 64}, 4), GGMLType::Q8_0));
    seeds.push_back(gguf_seed_image(w, "stories.gguf"));
  }
  if (const char* out = std::getenv("BP_FUZZ_SEEDS_OUT")) {
    std::filesystem::create_directories(out);
    for (size_t i = 0; i < seeds.size(); ++i) write_file_atomic(fmt::format("{}/seed{}.gguf", out, i), seeds[i]);
  }
  return seeds;
}

}  // namespace bp::test
