// `backprop estimate-vram` (issue 9): the memory plan of a training setup as a breakdown, what
// fits a memory size, and the cheapest change for a setup that does not fit (train/estimate.h).
//
// --model reads config.json only (a folder or the file itself): no weights are needed, so a
// 7B/8B config can be estimated on a laptop. Every flag is a setting, so TOML and
// BACKPROPAGATE_* variables work too. The setup is the trainer's: --batch-size sequences per
// optimizer step, --micro-batch-size sequences per forward/backward pass (auto = the whole batch
// in one pass), every sequence --max-seq-length tokens (the worst case the trainer plans for).
// The memory size is --vram-gb, else training.max_memory, else the GPU's free memory, else RAM.
// --device (as for `train`; auto = the GPU where a usable one would train) picks what is planned
// for: on CUDA the kernels' own device workspace is counted, and --base-dtype auto means bf16.
// cuBLASLt's workspace is a row of its own, sized for GPU 0's compute capability when there is a
// usable one, else at the largest recommendation (32 MiB, Hopper's).
#include <filesystem>
#include <iostream>

#include "cli/command.h"
#include "cli/estimate_vram.h"
#include "cli/model_ref.h"
#include "core/device_info.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "export/gguf_lora.h"
#include "io/gguf_reader.h"
#include "io/quantize.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/weight_names.h"
#include "ops/device_compute.h"
#include "train/estimate.h"
#include "train/train_options.h"

namespace {

namespace fs = std::filesystem;

struct Limit {
  size_t bytes = 0;
  std::string source;  // for the text and JSON output
};

// for_card: the plan is for a CUDA device (--device cuda, or auto with a usable GPU).
Limit memory_limit(const bp::Settings& st, const bp::CudaStatus& cuda, bool for_card) {
  const double gb = st.get_float("training.vram_gb");
  if (gb > 0) return {static_cast<size_t>(gb * 1024.0 * 1024.0 * 1024.0), fmt::format("--vram-gb {}", gb)};
  const std::string& mm = st.get_string("training.max_memory");
  if (mm != "auto" && mm != "none")
    return {static_cast<size_t>(bp::parse_byte_size(mm, "training.max_memory")), "training.max_memory " + mm};
  if (cuda.usable())
    return {cuda.devices[0].bytes_free, fmt::format("free memory of GPU 0 ({})", cuda.devices[0].name)};
  const auto ram = static_cast<size_t>(bp::mem_info().bytes_total);
  // A plan for a card that is not here: the RAM is all there is to read, which says nothing of the
  // card; say so, and how to name the card's size.
  if (for_card) return {ram, "this machine's RAM: no usable GPU here; --vram-gb N fits the plan to a card of N GiB"};
  return {ram, "this machine's RAM"};
}

// cuBLASLt's workspace for a run on CUDA (memory_plan.h gemm_workspace) and where its size comes from.
struct GemmWorkspaceSize {
  size_t bytes = 0;
  std::string source;
};
GemmWorkspaceSize gemm_workspace_size(const bp::CudaStatus& cuda) {
  if (cuda.usable()) {
    const bp::CudaDeviceInfo& d = cuda.devices[0];
    return {bp::cuda_workspace::gemm_workspace_bytes(d.cc_major),
            fmt::format("NVIDIA's size for compute capability {}.{}", d.cc_major, d.cc_minor)};
  }
  return {bp::cuda_workspace::kGemmWorkspaceBytesMax, "no GPU here: the largest (Hopper's)"};
}

// How a GGUF base's frozen weights are held under --base-dtype auto, as the trainer's plan counts
// them (train/train_plan.cpp): the stored type of the first layer's q projection (f32 where the
// loader widens it).
bp::DType gguf_stored_dtype(const std::string& gguf) {
  bp::GGUFReader reader(gguf);
  const bp::GGUFTensorInfo* t = reader.find_tensor(bp::gguf_name(bp::WeightRole::Q, 0));
  if (!t) t = reader.find_tensor("blk.0.attn_qkv.weight");  // phi3's fused q/k/v (model/weight_names.h)
  const std::optional<bp::DType> d = t ? bp::dtype_of_ggml(t->type) : std::nullopt;
  return d && bp::dtype_bytes(*d, t->numel()) == t->nbytes ? *d : bp::DType::F32;
}

std::string row(const std::string& name, const std::string& arithmetic, size_t bytes, const std::string& note = "") {
  return fmt::format("  {:<28}{:<46}{:>12}{}\n", name, arithmetic, bp::format_bytes(bytes),
                     note.empty() ? "" : "  " + note);
}

// What the estimate assumes about dtypes, when that differs from a CPU run.
std::vector<std::string> notes(const bp::Estimate& e, const std::string& dtype_setting) {
  const bp::EstimateRequest& r = e.request;
  std::vector<std::string> out;
  if (r.mode == bp::TrainMode::Full && r.matmul_dtype == bp::DType::BF16)
    out.push_back(
        fmt::format("full fine-tuning with bf16 GEMMs (--matmul-dtype): a bf16 copy of every linear "
                    "matrix and the LM head, {}, beside the f32 master weights",
                    bp::format_bytes(e.plan.weights)));
  if (r.weights_dtype == bp::DType::F32) return out;
  if (r.mode == bp::TrainMode::Full) {
    out.push_back(
        fmt::format("{}: in full fine-tuning every weight is trainable and kept in f32 (master "
                    "weights), so the dtype changes nothing here; the GEMMs' input type is --matmul-dtype.",
                    dtype_setting));
    return out;
  }
  out.push_back(fmt::format(
      "frozen weights held at {} ({}): the linear projections, embedding and LM head take {} instead of {} at f32; "
      "norms stay f32{}.",
      bp::dtype_name(r.weights_dtype), dtype_setting, bp::format_bytes(e.plan.weights), bp::format_bytes(e.weights_f32),
      bp::dtype_is_block(r.weights_dtype) ? ", and rows that are not whole blocks use the nearest type that fits"
                                          : ""));
  return out;
}

std::string render_text(const std::string& model_path, const bp::ModelConfig& cfg, const bp::Estimate& e,
                        const Limit& limit, const std::string& dtype_setting, const GemmWorkspaceSize& gemm_ws) {
  using bp::format_bytes;
  using bp::group_digits;
  const bp::EstimateRequest& r = e.request;
  const bp::MemoryPlan& p = e.plan;
  const bool lora = r.mode == bp::TrainMode::Lora;
  std::string t;
  t += fmt::format("Model: {} ({}, {} layers, hidden {}, vocab {}; {} parameters{})\n", model_path,
                   cfg.architecture_name, cfg.num_layers, group_digits(cfg.hidden_size), group_digits(cfg.vocab_size),
                   group_digits(e.base_parameters),
                   cfg.is_moe() ? fmt::format(", {} active per token: {} of {} experts on {} sparse layers",
                                              group_digits(e.active_parameters), cfg.num_experts_per_tok,
                                              cfg.num_experts, cfg.num_moe_layers())
                                : std::string());
  if (lora) {
    std::string targets;
    for (const auto& n : r.lora.resolved_targets()) targets += (targets.empty() ? "" : ",") + n;
    t += fmt::format("Setup: {}LoRA r={} on {} (dropout {}{})", r.lora.use_dora ? "DoRA " : "", r.lora.r, targets,
                     r.lora.dropout, r.lora.pissa() ? ", PiSSA initialisation" : "");
  } else {
    t += "Setup: full fine-tuning";
  }
  t += fmt::format(", gradient checkpointing {}\n", r.gradient_checkpointing ? "on" : "off");
  t += fmt::format("Micro-batch: {} sequences × {} tokens = {} tokens; batch {} = micro-batch {} × accumulation {}\n",
                   e.micro_batch_size, group_digits(r.max_seq_length), group_digits(e.micro_batch_tokens), r.batch_size,
                   e.micro_batch_size, e.grad_accum);
  for (const auto& n : notes(e, dtype_setting)) t += "Note: " + n + "\n";
  t += fmt::format("\nMemory plan (peak during {}):\n", p.peak_phase);
  const std::string n_train = group_digits(p.trainable_parameters);
  if (lora)
    t +=
        row(fmt::format("weights (frozen, {})", bp::dtype_name(r.weights_dtype)),
            bp::dtype_is_block(r.weights_dtype)
                ? fmt::format("{} parameters in {}-value blocks", group_digits(e.base_parameters),
                              bp::dtype_block_size(r.weights_dtype))
                : fmt::format("{} × {} bytes", group_digits(e.base_parameters), bp::dtype_block_bytes(r.weights_dtype)),
            p.weights);
  else if (r.matmul_dtype == bp::DType::BF16)
    t += row("weights (bf16 GEMM copies)", "linear matrices and LM head × 2 bytes", p.weights);
  else
    t += row("weights (frozen)", "none: every weight is trainable", p.weights);
  t += row("trainable parameters", fmt::format("{} × 4 bytes", n_train), p.trainable);
  t += row("gradients", fmt::format("{} × 4 bytes", n_train), p.gradients);
  t += row("optimizer state (AdamW)",
           r.optimizer_shards > 1
               ? fmt::format("2 × {} × 4 bytes (m, v) ÷ {} ranks (ZeRO-1)", n_train, r.optimizer_shards)
               : fmt::format("2 × {} × 4 bytes (m, v)", n_train),
           p.optimizer_state);
  if (r.device == bp::DeviceType::CUDA) t += row("GEMM workspace (cuBLASLt)", gemm_ws.source, p.gemm_workspace);
  t += row("saved activations",
           r.gradient_checkpointing ? "layer inputs (gradient checkpointing)" : "every layer's activations",
           p.saved_activations);
  t += row("recompute buffers", r.gradient_checkpointing ? "one layer's activations in backward" : "none",
           p.recompute_buffers);
  // On a card the fused loss's kernel has its own workspace (logits, their gradient, row losses,
  // bf16 copies): memory_plan.cpp's DeviceScratch, not the CPU's logits chunk.
  const std::string ce =
      r.device == bp::DeviceType::CUDA
          ? fmt::format("device workspace, {}-token windows × {} vocab",
                        std::min<int64_t>(e.micro_batch_tokens, r.ce_chunk_tokens), cfg.vocab_size)
          : bp::cross_entropy_chunk_arithmetic(e.micro_batch_tokens, cfg.vocab_size, r.ce_chunk_tokens);
  t += row("cross-entropy chunk", ce, p.cross_entropy_chunk, p.cross_entropy_chunk ? "" : "(freed before the peak)");
  t += row("workspace", "activation gradients, temporaries", p.workspace);
  t += row("total", "", p.total());

  t += fmt::format("Planned for: {}\n", r.device == bp::DeviceType::CUDA
                                            ? "a CUDA device (with the kernels' own device workspace)"
                                            : "the CPU");
  t += fmt::format("\nMemory to fit: {} ({})\n", format_bytes(limit.bytes), limit.source);
  if (e.fits)
    t += fmt::format("Fits: yes, {} to spare\n", format_bytes(limit.bytes - p.total()));
  else
    t += fmt::format("Fits: no, {} more than {} is needed\n", format_bytes(p.total() - limit.bytes),
                     format_bytes(limit.bytes));
  const std::string at_least = e.max_micro_batch_tokens >= bp::kMaxSearchTokens ? "at least " : "";
  if (e.max_micro_batch_tokens == 0) {
    t += fmt::format(
        "Not even one token per micro-batch fits: weights, trainable parameters, gradients, optimizer state{} alone "
        "need {}\n",
        p.gemm_workspace ? " and the GEMM workspace" : "", format_bytes(p.persistent()));
  } else {
    t += fmt::format("Largest micro-batch at {} tokens per sequence: {}{} sequences ({} tokens)\n",
                     group_digits(r.max_seq_length), at_least, group_digits(e.max_micro_batch_size),
                     group_digits(e.max_micro_batch_size * r.max_seq_length));
    t += fmt::format("Largest max sequence length at {} sequences per micro-batch: {}{} tokens\n", e.micro_batch_size,
                     at_least, group_digits(e.max_seq_length));
  }
  if (!e.fits) {
    if (e.has_fix && e.fix.fits)
      t += fmt::format(
          "{}: {} ({}): total {}\n",
          e.fix.kind == "combined" ? "No single change is enough; these together fit" : "Cheapest change that fits",
          e.fix.description, e.fix.flags, format_bytes(e.fix.total));
    else if (e.has_fix)
      t += fmt::format("No change of these settings fits: even {} ({}) needs {}\n", e.fix.description, e.fix.flags,
                       format_bytes(e.fix.total));
    if (!e.tried.empty()) {
      t += "Changes tried, in order:\n";
      for (const auto& c : e.tried)
        t += fmt::format("  {:<80} {:>12}  {}\n", c.description, format_bytes(c.total),
                         c.fits ? "fits" : "does not fit");
    }
  }
  return t;
}

}  // namespace

namespace bp::cli {
VramReport estimate_vram_report(const Settings& st) {
  const std::string model = cli::resolve_model(st.get_string("model.path"), hub::ModelFiles::Config);
  if (model.empty())
    throw Error(ErrorCode::CONFIG_INVALID,
                "[estimate-vram] no model: pass --model DIR (a folder with config.json) or --model path/config.json");
  const ModelConfig cfg = fs::is_regular_file(model) ? ModelConfig::from_file(model) : load_model_config(model);

  EstimateRequest r;
  r.mode = st.get_string("training.mode") == "full" ? TrainMode::Full : TrainMode::Lora;
  r.lora.r = st.get_int("lora.r");
  r.lora.alpha = static_cast<float>(st.get_float("lora.alpha"));
  r.lora.dropout = static_cast<float>(st.get_float("lora.dropout"));
  r.lora.target_modules = split_list(st.get_string("lora.target_modules"));
  r.lora.use_dora = st.get_bool("lora.use_dora");
  r.lora.init_lora_weights = st.get_string("lora.init_lora_weights");
  const std::string& gc = st.get_string("training.gradient_checkpointing");
  r.gradient_checkpointing = gc != "false";
  r.batch_size = st.get_int("training.batch_size");
  // --nproc N: one rank's memory. A rank trains its share of the global batch (at most ceil(B/N)
  // sequences per step, so micro-batches never exceed it) and, with ZeRO-1 (--shard-optimizer, on
  // by default when N > 1), holds 1/N of AdamW's m and v.
  const int64_t nproc = st.get_int("training.nproc");
  if (nproc > 1) r.batch_size = (r.batch_size + nproc - 1) / nproc;
  r.optimizer_shards = nproc > 1 && st.get_string("training.shard_optimizer") != "false" ? static_cast<int>(nproc) : 1;
  const std::string& mb = st.get_string("training.micro_batch_size");
  r.micro_batch_size = mb == "auto" ? 0 : std::stoll(mb);
  r.max_seq_length = st.get_int("training.max_seq_length");
  // --method: a pair (dpo, orpo, simpo) is two sequences in the same micro-batch, so batch and
  // micro-batch count 2 sequences per example; the reference and KL passes run without gradient
  // over the same micro-batch, below the training pass's peak.
  const TrainMethod method = parse_train_method(st.get_string("training.method"));
  const int64_t seqs_per_example = method_is_pairwise(method) ? 2 : 1;
  r.batch_size *= seqs_per_example;
  r.micro_batch_size *= seqs_per_example;
  r.threads = static_cast<int>(st.get_int("training.threads"));
  const CudaStatus cuda = cuda_status();
  // --device, as `train` reads it: auto plans for the GPU where a usable one would train.
  const std::string& device = st.get_string("model.device");
  r.device = (device == "auto" ? cuda.usable() : device.rfind("cuda", 0) == 0) ? DeviceType::CUDA : DeviceType::CPU;
  // --base-dtype: how frozen weights are held, resolved as `train` resolves it (model/held_weights.h:
  // auto keeps a GGUF base's stored types, planned at the type of its first q projection as the
  // trainer's plan counts them; any other base f32 on the CPU, bf16 on a card).
  const std::string base_setting = st.get_string("model.base_dtype");
  const std::string dtype_setting = "--base-dtype " + base_setting;
  const std::string gguf = gguf_base_file(fs::is_regular_file(model) ? fs::path(model).parent_path().string() : model);
  const std::optional<DType> base = resolve_base_dtype(base_setting, r.device, !gguf.empty());
  r.weights_dtype = base ? *base : gguf_stored_dtype(gguf);
  // --matmul-dtype, as `train` resolves it (a plan for a card not here assumes bf16 tensor cores).
  const bool f16_card = r.device == DeviceType::CUDA && !cuda.devices.empty() && cuda.devices[0].cc_major < 8;
  r.matmul_dtype = resolve_matmul_dtype(st.get_string("training.matmul_dtype"), r.mode, r.device, f16_card,
                                        cuda.devices.empty() ? "the CUDA device" : cuda.devices[0].name);
  const Limit limit = memory_limit(st, cuda, r.device == DeviceType::CUDA);
  r.limit_bytes = limit.bytes;
  const GemmWorkspaceSize gemm_ws = gemm_workspace_size(cuda);
  r.gemm_workspace_bytes = gemm_ws.bytes;

  Estimate e = estimate_memory(cfg, r);
  if (gc == "auto" && e.fits) {  // as the trainer decides: off when the same micro-batch fits without it
    EstimateRequest off = r;
    off.gradient_checkpointing = false;
    off.micro_batch_size = e.micro_batch_size;
    if (Estimate e_off = estimate_memory(cfg, off); e_off.fits) e = std::move(e_off);
  }
  VramReport out;
  {
    nlohmann::json& j = out.json;
    j = e.to_json();
    j["model"] = {{"path", model},
                  {"architecture", cfg.architecture_name},
                  {"num_layers", cfg.num_layers},
                  {"hidden_size", cfg.hidden_size},
                  {"vocab_size", cfg.vocab_size}};
    j["limit_source"] = limit.source;
    j["dtype_setting"] = dtype_setting;
    if (r.device == DeviceType::CUDA) j["gemm_workspace_source"] = gemm_ws.source;
    j["notes"] = notes(e, dtype_setting);
    j["method"] = train_method_name(method);
    j["sequences_per_example"] = seqs_per_example;
    j["nproc"] = nproc;  // the plan is one rank's
    j["optimizer_shards"] = r.optimizer_shards;
  }
  {
    if (seqs_per_example > 1)
      out.text += fmt::format(
          "Method {}: each example is a pair, its chosen and rejected sequences in the same "
          "micro-batch; sequences below are 2 per example.\n",
          train_method_name(method));
    out.text += render_text(model, cfg, e, limit, dtype_setting, gemm_ws);
  }
  return out;
}
}  // namespace bp::cli

namespace {

int run_estimate_vram() {
  const bp::cli::VramReport r = bp::cli::estimate_vram_report(bp::cli::settings());
  if (bp::cli::global_options().json)
    std::cout << r.json.dump(2) << std::endl;
  else
    std::cout << r.text;
  return 0;
}

bp::cli::RunFn setup_estimate_vram(CLI::App& sub) {
  for (std::string_view key : bp::cli::kEstimateVramSettingKeys) bp::cli::bind_settings(sub, {key});
  sub.footer(
      "The estimate is for one micro-batch of --micro-batch-size sequences (auto = all --batch-size sequences of an "
      "optimizer step in one pass) of --max-seq-length tokens each, the worst case `backprop train` plans for. Only "
      "config.json is read. The memory size is --vram-gb, else training.max_memory, else the GPU's free memory, else "
      "this machine's RAM.");
  return run_estimate_vram;
}

}  // namespace

BP_REGISTER_COMMAND("estimate-vram",
                    "Predict training memory from config.json (weights, gradients, optimizer, activations) and what "
                    "fits a memory size",
                    setup_estimate_vram);
