// LoraAdapter -> GGUF LoRA file (contract in export/gguf_lora.h).
#include "export/gguf_lora.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/file_read.h"
#include "export/gguf_export.h"
#include "io/atomic_file.h"
#include "io/gguf_writer.h"
#include "model/loader_gguf.h"
#include "model/weight_names.h"

namespace bp {

std::string gguf_base_file(const std::string& model_dir) {
  const std::filesystem::path cfg = std::filesystem::path(model_dir) / "config.json";
  std::error_code ec;
  if (model_dir.empty() || !std::filesystem::is_regular_file(cfg, ec)) return "";
  const nlohmann::json j = parse_json_bounded(read_file(cfg.string()), cfg.string(), "export");
  if (!j.is_object() || !j.contains(kGGUFSourceKey) || !j[kGGUFSourceKey].is_string()) return "";
  return j[kGGUFSourceKey].get<std::string>();
}

GGUFLoraResult export_gguf_lora(const LoraAdapter& given, const ModelConfig& base, GGMLType type,
                                const std::string& path, const std::string& name) {
  const LoraAdapter converted = pissa_to_lora(given);  // PiSSA: the LoRA for the original base
  const LoraAdapter& adapter = given.config.pissa() ? converted : given;
  if (type != GGMLType::F32 && type != GGMLType::F16)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] a GGUF LoRA adapter is stored as f32 or f16, not {}", ggml_type_name(type)));
  if (adapter.config.use_dora)  // llama.cpp's LoRA adapters hold A and B only: no per-row magnitude
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED,
                "[gguf-lora] a DoRA adapter cannot be a GGUF LoRA file: llama.cpp's adapters hold lora_a/lora_b "
                "only, not DoRA's magnitudes")
        .with_suggestion("Export it merged (--format gguf or --format merged), which applies the magnitudes.");
  BP_CHECK(static_cast<int64_t>(adapter.layers.size()) == base.num_layers,
           "[gguf-lora] the adapter has {} layers, the base {}", adapter.layers.size(), base.num_layers);
  const LoraConfig& lc = adapter.config;
  // llama.cpp scales by alpha / r: write the alpha that gives our scale.
  const float alpha = lc.use_rslora ? lc.alpha * std::sqrt(static_cast<float>(lc.r)) : lc.alpha;
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str(gguf_arch_name(base.arch)));
  w.set("general.type", GGUFValue::str("adapter"));
  w.set("general.name", GGUFValue::str(name.empty() ? std::filesystem::path(path).stem().string() : name));
  w.set("general.file_type", GGUFValue::u32(type == GGMLType::F16 ? 1 : 0));
  w.set("adapter.type", GGUFValue::str("lora"));
  w.set("adapter.lora.alpha", GGUFValue::f32(alpha));
  const bool permute = arch_info(base.arch).gguf_permute_qk;
  for (size_t li = 0; li < adapter.layers.size(); ++li) {
    const LoraLayer& layer = adapter.layers[li];
    for (LoraTarget t : kAllLoraTargets) {
      if (!layer.has(t)) continue;
      std::string base_name = gguf_name(lora_target_role(t), static_cast<int64_t>(li));
      const Tensor& a = layer.a(t);
      const Tensor& b = layer.b(t);
      BP_CHECK(a.rank() == 2 && b.rank() == 2 && a.dim(0) == b.dim(1) && a.dim(1) == lora_target_in(base, t) &&
                   b.dim(0) == lora_target_out(base, t),
               "[gguf-lora] {}: lora_A {} and lora_B {} do not fit the base", base_name, a.describe(), b.describe());
      // A fused module (phi3): its one A and B [Σout, r] on the fused tensor (attn_qkv, ffn_up).
      if (const FusedProjection* f = lc.fused ? fused_projection_of(base, lora_target_role(t)) : nullptr) {
        if (lora_target_role(t) != f->first) continue;
        std::vector<const Tensor*> bs;
        for (int i = 0; i < f->count; ++i) bs.push_back(&layer.b(static_cast<LoraTarget>(static_cast<int>(t) + i)));
        base_name = fmt::format(fmt::runtime(f->gguf), li);
        w.add_tensor(gguf_tensor_from(base_name + ".lora_a", a, type));
        w.add_tensor(gguf_tensor_from(base_name + ".lora_b", join_rows_or_copy(bs), type));
        continue;
      }
      w.add_tensor(gguf_tensor_from(base_name + ".lora_a", a, type));
      if (permute && (t == LoraTarget::Q || t == LoraTarget::K))
        w.add_tensor(gguf_permuted_rows_spec(base_name + ".lora_b", b, type, base.head_dim));
      else
        w.add_tensor(gguf_tensor_from(base_name + ".lora_b", b, type));
    }
  }
  // Mixture-of-Experts: every expert's A and B of a projection, stacked as the experts are
  // (A [E, r, in], B [E, out, r]: ne [in, r, E] and [r, out, E]) on blk.N.ffn_{gate,up,down}_exps,
  // which llama.cpp applies per routed expert (build_lora_mm_id: mul_mat_id of lora_a, then lora_b,
  // scaled by alpha / r like the others).
  constexpr WeightRole kExpertRoles[3] = {WeightRole::ExpertGate, WeightRole::ExpertUp, WeightRole::ExpertDown};
  for (size_t li = 0; li < adapter.layers.size(); ++li)
    for (size_t p = 0; p < 3; ++p) {
      const Tensor& a = adapter.layers[li].expert_A[p];
      const Tensor& b = adapter.layers[li].expert_B[p];
      if (!a.defined()) continue;
      const std::string base_name = gguf_name(kExpertRoles[p], static_cast<int64_t>(li));
      const Shape want = role_shape(base, kExpertRoles[p]);  // [E, out, in]
      BP_CHECK(a.rank() == 3 && b.rank() == 3 && a.dim(0) == want[0] && b.dim(0) == want[0] && a.dim(1) == b.dim(2) &&
                   a.dim(2) == want[2] && b.dim(1) == want[1],
               "[gguf-lora] {}: expert lora_A {} and lora_B {} do not fit the experts {}", base_name, a.describe(),
               b.describe(), want.str());
      w.add_tensor(gguf_tensor_from(base_name + ".lora_a", a, type));
      w.add_tensor(gguf_tensor_from(base_name + ".lora_b", b, type));
    }
  // The router: A [r, D] and B [E, r] on blk.N.ffn_gate_inp.weight (llama.cpp's build_moe_ffn computes
  // the router's logits with build_lora_mm, so an adapter on it applies like any other projection's).
  for (size_t li = 0; li < adapter.layers.size(); ++li) {
    const Tensor& a = adapter.layers[li].router_A;
    const Tensor& b = adapter.layers[li].router_B;
    if (!a.defined()) continue;
    const std::string base_name = gguf_name(WeightRole::Router, static_cast<int64_t>(li));
    BP_CHECK(a.rank() == 2 && b.rank() == 2 && a.dim(0) == b.dim(1) && a.dim(1) == base.hidden_size &&
                 b.dim(0) == base.num_experts,
             "[gguf-lora] {}: router lora_A {} and lora_B {} do not fit the base", base_name, a.describe(),
             b.describe());
    w.add_tensor(gguf_tensor_from(base_name + ".lora_a", a, type));
    w.add_tensor(gguf_tensor_from(base_name + ".lora_b", b, type));
  }
  w.write(path);
  GGUFLoraResult r;
  r.path = path;
  r.bytes = w.expected_file_bytes();
  r.tensor_count = static_cast<int64_t>(w.tensors().size());
  r.alpha = alpha;
  r.type = type;
  return r;
}

}  // namespace bp
