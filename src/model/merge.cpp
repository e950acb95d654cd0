// Saving Hugging Face model folders and merging LoRA adapters (see merge.h).
#include "model/merge.h"

#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/weight_names.h"
#include "ops/linear.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorCode::RUNTIME_EXPORT_FAILED, "[merge] " + what);
}

// DoRA: W' = (m / ||W'||_row) ⊙ W' for W' = W + s·B·A (PEFT's DoRA merge), on the host.
void dora_rescale_rows(Tensor& W, const Tensor& m, size_t layer, LoraTarget t) {
  const int64_t out = W.dim(0), in = W.dim(1);
  if (!m.defined() || m.shape() != Shape{out} || m.dtype() != DType::F32 || m.device().type != DeviceType::CPU ||
      W.device().type != DeviceType::CPU)
    fail(fmt::format("layer {} {}: the DoRA magnitude {} does not fit the weight {} (an f32 [{}] on the CPU)", layer,
                     lora_target_name(t), m.defined() ? m.describe() : "missing", W.describe(), out));
  const Tensor norms = weight_row_norms(W, false);
  float* w = W.data<float>();
  for (int64_t j = 0; j < out; ++j) {
    const float c = m.data<float>()[j] / norms.data<float>()[j];
    for (int64_t i = 0; i < in; ++i) w[j * in + i] *= c;
  }
}

}  // namespace

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "tokenizer.model",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "added_tokens.json",
                                                 "chat_template.jinja",
                                                 "chat_template.json",
                                                 "generation_config.json"};
  return names;
}

std::vector<std::string> save_hf_model(const ModelWeights& w, const std::string& dir, const SaveModelOptions& o) {
  const DType dtype = o.dtype.value_or(w.config.torch_dtype);
  if (dtype == DType::I32) fail("cannot save model weights as i32");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(fmt::format("cannot create folder {}: {}", dir, ec.message()));

  SafetensorsWriteOptions wo;
  wo.dtype = dtype;
  std::vector<std::string> written = write_safetensors_model(dir, named_hf_weights(w), o.max_shard_bytes, wo);

  ModelConfig cfg = w.config;
  cfg.torch_dtype = dtype;
  write_file_atomic((fs::path(dir) / "config.json").string(), cfg.to_json().dump(2) + "\n");
  written.push_back("config.json");

  if (!o.copy_files_from.empty() && fs::weakly_canonical(o.copy_files_from, ec) != fs::weakly_canonical(dir, ec)) {
    for (const std::string& name : tokenizer_file_names()) {
      const fs::path src = fs::path(o.copy_files_from) / name;
      if (!fs::exists(src)) continue;
      fs::copy_file(src, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) fail(fmt::format("cannot copy {} to {}: {}", src.string(), dir, ec.message()));
      written.push_back(name);
    }
  }
  return written;
}

void merge_lora_into(ModelWeights& w, const LoraAdapter& adapter) {
  const ModelConfig& cfg = w.config;
  if (adapter.layers.size() != w.layers.size())
    fail(fmt::format("the adapter has {} layers but the model has {}", adapter.layers.size(), w.layers.size()));
  const float scale = adapter.config.scale();
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LoraLayer& l = adapter.layers[li];
    for (LoraTarget t : kAllLoraTargets) {
      if (!l.has(t)) continue;
      Tensor& W = weight_ref(w, lora_target_role(t), static_cast<int64_t>(li));
      const Tensor &A = l.a(t), &B = l.b(t);
      const int64_t out = lora_target_out(cfg, t), in = lora_target_in(cfg, t);
      const int64_t r = A.rank() == 2 ? A.dim(0) : -1;
      if (W.shape() != Shape({out, in}) || A.shape() != Shape({r, in}) || B.shape() != Shape({out, r}) ||
          W.dtype() != DType::F32 || A.dtype() != DType::F32 || B.dtype() != DType::F32)
        fail(fmt::format("layer {} {}: W {} with lora_A {} and lora_B {} do not fit (expected A [r, {}], B [{}, r])",
                         li, lora_target_name(t), W.describe(), A.describe(), B.describe(), in, out));
      // W[out, in] += scale · B[out, r] · A[r, in]
      matmul_accumulate(W, scale, B, A);
      if (adapter.config.use_dora) dora_rescale_rows(W, l.m(t), li, t);
    }
    // Mixture-of-Experts: each expert's W_e += scale · B_e · A_e, in its slab of the stacked weight.
    for (int p = 0; p < 3; ++p) {
      const Tensor &A = l.expert_A[static_cast<size_t>(p)], &B = l.expert_B[static_cast<size_t>(p)];
      if (!A.defined()) continue;
      Tensor& W = weight_ref(w, static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + p),
                             static_cast<int64_t>(li));
      if (!W.defined() || W.dtype() != DType::F32 || W.dim(0) != A.dim(0) || A.dim(2) != W.dim(2) ||
          B.dim(1) != W.dim(1))
        fail(fmt::format("layer {} experts' {}: W {} with lora_A {} and lora_B {} do not fit", li, p, W.describe(),
                         A.describe(), B.describe()));
      const Tensor& M = l.expert_M[static_cast<size_t>(p)];
      for (int64_t e = 0; e < W.dim(0); ++e) {
        Tensor We = expert_matrix(W, e);
        matmul_accumulate(We, scale, expert_matrix(B, e), expert_matrix(A, e));
        if (adapter.config.use_dora)  // expert e's own magnitude (row e), its own rows' norms
          dora_rescale_rows(We, M.defined() ? M.rows(e, e + 1).reshape({M.dim(1)}) : Tensor(), li,
                            static_cast<LoraTarget>(static_cast<int>(LoraTarget::Gate) + p));
      }
    }
    // The router: W_r [E, D] += scale · B [E, r] · A [r, D].
    if (l.router_A.defined()) {
      Tensor& W = weight_ref(w, WeightRole::Router, static_cast<int64_t>(li));
      const Tensor &A = l.router_A, &B = l.router_B;
      if (!W.defined() || W.dtype() != DType::F32 || A.rank() != 2 || B.rank() != 2 || A.dim(1) != W.dim(1) ||
          B.dim(0) != W.dim(0) || A.dim(0) != B.dim(1))
        fail(fmt::format("layer {} router: W {} with lora_A {} and lora_B {} do not fit", li, W.describe(),
                         A.describe(), B.describe()));
      matmul_accumulate(W, scale, B, A);
    }
  }
}

ModelWeights merge_lora(const ModelWeights& base, const LoraAdapter& adapter) {
  ModelWeights w = base;  // shares every tensor
  for (size_t li = 0; li < w.layers.size() && li < adapter.layers.size(); ++li)
    for (LoraTarget t : kAllLoraTargets)
      if (adapter.layers[li].has(t)) {
        Tensor& W = weight_ref(w, lora_target_role(t), static_cast<int64_t>(li));
        // A frozen weight held narrower (bf16, q8_0, q4_K, ...: --base-dtype) is merged in f32: its
        // held values widened, as the training GEMMs read them.
        W = W.to(DType::F32);
      }
  for (size_t li = 0; li < w.layers.size() && li < adapter.layers.size(); ++li)
    for (int p = 0; p < 3; ++p)
      if (adapter.layers[li].expert_A[static_cast<size_t>(p)].defined()) {  // the stacked experts, a copy in f32
        Tensor& W = weight_ref(w, static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + p),
                               static_cast<int64_t>(li));
        W = W.dtype() == DType::F32 ? W.clone() : W.to(DType::F32);
      }
  for (size_t li = 0; li < w.layers.size() && li < adapter.layers.size(); ++li)
    if (adapter.layers[li].router_A.defined()) {  // the router (f32, never held): a copy
      Tensor& W = weight_ref(w, WeightRole::Router, static_cast<int64_t>(li));
      W = W.dtype() == DType::F32 ? W.clone() : W.to(DType::F32);
    }
  merge_lora_into(w, adapter);
  return w;
}

}  // namespace bp
