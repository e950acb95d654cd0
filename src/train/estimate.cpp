// The search behind `backprop estimate-vram` (see estimate.h): one memory plan for the request,
// binary searches over micro-batch tokens for what fits, and the ordered list of changes.
#include "train/estimate.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace bp {

namespace {

// The knobs the search turns; everything else comes from the request.
struct Setup {
  bool ckpt = true;
  TrainMode mode = TrainMode::Lora;
  int64_t r = 16;
  int64_t micro = 1;        // sequences per micro-batch
  int64_t seq = 1;          // max sequence length
  DType base = DType::F32;  // how the frozen weights are held (model.base_dtype)
};

// The narrower held types offered as fixes, widest first.
constexpr DType kQuantizedBases[] = {DType::Q8_0, DType::Q4_K};

class Searcher {
 public:
  Searcher(const ModelConfig& cfg, const EstimateRequest& req) : cfg_(cfg), req_(req) {}

  Setup requested() const {
    return {req_.gradient_checkpointing, req_.mode,           req_.lora.r,
            req_.micro_batch(),          req_.max_seq_length, req_.weights_dtype};
  }

  MemorySettings settings(const Setup& s, int64_t tokens) const {
    MemorySettings m;
    m.mode = s.mode;
    m.lora = req_.lora;
    m.lora.r = s.r;
    m.gradient_checkpointing = s.ckpt;
    m.micro_batch_tokens = tokens;
    m.ce_chunk_tokens = req_.ce_chunk_tokens;
    m.threads = req_.threads;
    m.optimizer_shards = req_.optimizer_shards;
    m.base_dtype = s.base;
    m.head_dtype = s.mode == TrainMode::Lora ? s.base : DType::F32;  // the head is held like the base
    m.matmul_dtype = s.mode == TrainMode::Full ? req_.matmul_dtype : DType::F32;
    m.device = req_.device;
    m.gemm_workspace_bytes = req_.gemm_workspace_bytes;
    return m;
  }

  MemoryPlan plan(const Setup& s) const { return plan_memory(cfg_, settings(s, s.micro * s.seq)); }
  bool fits(const Setup& s) const { return plan(s).total() <= req_.limit_bytes; }

  // Largest micro-batch in tokens that fits with this setup's other knobs (0: none).
  int64_t max_tokens(const Setup& s) const {
    return max_micro_batch_tokens(cfg_, settings(s, 1), req_.limit_bytes, kMaxSearchTokens);
  }

  EstimateChange change(const std::string& kind, const std::string& description, const Setup& s) const {
    EstimateChange c;
    c.kind = kind;
    c.description = description;
    c.gradient_checkpointing = s.ckpt;
    c.mode = s.mode;
    c.lora_r = s.mode == TrainMode::Lora ? s.r : 0;
    c.micro_batch_size = s.micro;
    c.grad_accum = (req_.batch_size + s.micro - 1) / s.micro;
    c.max_seq_length = s.seq;
    c.total = plan(s).total();
    c.fits = c.total <= req_.limit_bytes;
    const Setup r = requested();
    std::vector<std::string> f;
    if (s.ckpt != r.ckpt) f.push_back(s.ckpt ? "--gradient-checkpointing" : "--no-gradient-checkpointing");
    if (s.micro != r.micro) f.push_back(fmt::format("--micro-batch-size {}", s.micro));
    if (s.seq != r.seq) f.push_back(fmt::format("--max-seq-length {}", s.seq));
    if (s.mode != r.mode) f.push_back(s.mode == TrainMode::Lora ? "--mode lora" : "--mode full");
    if (s.mode == TrainMode::Lora && (s.r != r.r || s.mode != r.mode)) f.push_back(fmt::format("--lora-r {}", s.r));
    if (s.base != r.base) f.push_back(fmt::format("--base-dtype {}", base_flag(s.base)));
    for (const auto& x : f) c.flags += (c.flags.empty() ? "" : " ") + x;
    return c;
  }

  static std::string base_flag(DType t) { return t == DType::Q4_K ? "q4_k" : dtype_name(t); }

  // The widest quantized base (q8_0, then q4_k) with which `s` fits; the narrowest when none does.
  // Only for LoRA runs whose frozen weights are wider than it.
  bool quantize(Setup& s) const {
    if (s.mode != TrainMode::Lora) return false;
    const size_t before = plan(s).weights;
    bool changed = false;
    for (DType q : kQuantizedBases) {
      Setup t = s;
      t.base = q;
      if (plan(t).weights >= before) continue;
      s.base = q;
      changed = true;
      if (fits(s)) break;
    }
    return changed;
  }

  std::string quantize_text(DType t) const {
    return fmt::format("frozen weights held at {} (QLoRA) instead of {}", dtype_name(t),
                       dtype_name(req_.weights_dtype));
  }

  std::string micro_text(int64_t k) const {
    return fmt::format("micro-batch of {} sequence{} with gradient accumulation {} (batch {} unchanged)", k,
                       k == 1 ? "" : "s", (req_.batch_size + k - 1) / k, req_.batch_size);
  }

 private:
  const ModelConfig& cfg_;
  const EstimateRequest& req_;
};

// Largest r in r/2, r/4, ..., 1 for which the setup fits; 0 when none does.
int64_t largest_fitting_r(const Searcher& S, Setup s) {
  for (int64_t r = s.r / 2; r >= 1; r /= 2) {
    s.r = r;
    if (S.fits(s)) return r;
  }
  return 0;
}

// A shorter max sequence length is a cheap change only while it keeps at least half the requested
// length (and kMinUsefulSeqLength tokens); below that, two earlier changes together are better.
int64_t min_useful_seq_length(int64_t requested) {
  return std::max(kMinUsefulSeqLength, requested / 2);
}

void check_request(const EstimateRequest& r) {
  auto bad = [](const std::string& what) { throw Error(ErrorCode::CONFIG_INVALID_SETTING, "[estimate] " + what); };
  if (r.batch_size < 1) bad(fmt::format("batch_size must be >= 1, got {}", r.batch_size));
  if (r.micro_batch_size < 0) bad(fmt::format("micro_batch_size must be >= 1 (or auto), got {}", r.micro_batch_size));
  if (r.max_seq_length < 1) bad(fmt::format("max_seq_length must be >= 1, got {}", r.max_seq_length));
  if (r.micro_batch() > kMaxSearchTokens / r.max_seq_length)
    bad(fmt::format("a micro-batch of {} sequences × {} tokens is more than {} tokens", r.micro_batch(),
                    r.max_seq_length, kMaxSearchTokens));
  if (r.weights_dtype == DType::I32) bad("weights dtype must be f32, bf16, f16, q8_0 or q4_k, got i32");
  if (r.mode == TrainMode::Frozen) bad("mode must be lora or full");
}

}  // namespace

int64_t EstimateRequest::micro_batch() const {
  return micro_batch_size > 0 ? std::min(micro_batch_size, batch_size) : batch_size;
}

MemorySettings EstimateRequest::memory_settings() const {
  MemorySettings m;
  m.mode = mode;
  m.lora = lora;
  m.gradient_checkpointing = gradient_checkpointing;
  m.micro_batch_tokens = micro_batch_tokens();
  m.ce_chunk_tokens = ce_chunk_tokens;
  m.threads = threads;
  m.optimizer_shards = optimizer_shards;
  m.device = device;
  m.gemm_workspace_bytes = gemm_workspace_bytes;
  m.matmul_dtype = mode == TrainMode::Full ? matmul_dtype : DType::F32;
  return m;
}

MemoryPlan plan_memory_dtype(const ModelConfig& cfg, const MemorySettings& s, DType weights_dtype) {
  MemorySettings m = s;
  m.base_dtype = weights_dtype;
  return plan_memory(cfg, m);
}

Estimate estimate_memory(const ModelConfig& cfg, const EstimateRequest& request) {
  check_request(request);
  EstimateRequest req = request;
  if (req.mode == TrainMode::Lora) {
    req.lora.validate_for(cfg);                // q_proj on Phi-3 is refused here as in training
    req.lora.fused = cfg.fused_projections();  // PEFT's names of the fused modules in the report
  }
  Searcher S(cfg, req);
  const Setup asked = S.requested();
  Estimate e;
  e.request = req;
  e.micro_batch_size = asked.micro;
  e.grad_accum = (req.batch_size + asked.micro - 1) / asked.micro;
  e.micro_batch_tokens = asked.micro * asked.seq;
  e.plan = S.plan(asked);
  e.base_parameters = cfg.num_parameters();
  e.active_parameters = cfg.num_active_parameters();
  e.weights_f32 = plan_memory(cfg, req.memory_settings()).weights;
  e.fits = e.plan.total() <= req.limit_bytes;
  e.max_micro_batch_tokens = S.max_tokens(asked);
  e.max_micro_batch_size = e.max_micro_batch_tokens / asked.seq;
  e.max_seq_length = e.max_micro_batch_tokens / asked.micro;
  if (e.fits) return e;

  // 1-5: each change alone, in order; the first that fits is the cheapest.
  if (!asked.ckpt) {
    Setup s = asked;
    s.ckpt = true;
    e.tried.push_back(S.change("gradient_checkpointing", "turn on gradient checkpointing", s));
  }
  if (asked.micro > 1) {
    Setup s = asked;
    s.micro = std::clamp<int64_t>(e.max_micro_batch_size, 1, asked.micro - 1);
    e.tried.push_back(S.change("micro_batch_size", S.micro_text(s.micro), s));
  }
  if (Setup s = asked; S.quantize(s)) e.tried.push_back(S.change("base_dtype", S.quantize_text(s.base), s));
  if (e.max_seq_length < asked.seq && e.max_seq_length >= min_useful_seq_length(asked.seq)) {
    Setup s = asked;
    s.seq = e.max_seq_length;
    e.tried.push_back(
        S.change("max_seq_length", fmt::format("max sequence length {} instead of {}", s.seq, asked.seq), s));
  }
  if (asked.mode == TrainMode::Full) {
    Setup s = asked;
    s.mode = TrainMode::Lora;
    e.tried.push_back(S.change("mode", fmt::format("LoRA (r={}) instead of full fine-tuning", asked.r), s));
  }
  if (asked.mode == TrainMode::Lora && asked.r > 1) {
    Setup s = asked;
    const int64_t r = largest_fitting_r(S, s);
    s.r = r > 0 ? r : 1;
    e.tried.push_back(S.change("lora_r", fmt::format("LoRA r={} instead of {}", s.r, asked.r), s));
  }
  for (const auto& c : e.tried)
    if (c.fits) {
      e.has_fix = true;
      e.fix = c;
      return e;
    }

  // None alone: combine them in the same order, each as far as needed.
  Setup s = asked;
  std::vector<std::string> what;
  auto done = [&] { return S.fits(s); };
  auto finish = [&] {
    std::string d;
    for (const auto& w : what) d += (d.empty() ? "" : " + ") + w;
    e.has_fix = true;
    e.fix = S.change("combined", d, s);
  };
  if (!s.ckpt) {
    s.ckpt = true;
    what.push_back("gradient checkpointing on");
    if (done()) {
      finish();
      return e;
    }
  }
  if (s.micro > 1) {
    s.micro = std::clamp<int64_t>(S.max_tokens(s) / s.seq, 1, s.micro - 1);
    what.push_back(S.micro_text(s.micro));
    if (done()) {
      finish();
      return e;
    }
  }
  if (Setup q = s; S.quantize(q) && S.fits(q)) {  // like a lower r: only when it is enough
    s = q;
    what.push_back(fmt::format("frozen weights at {}", dtype_name(s.base)));
    finish();
    return e;
  }
  auto shorten = [&](int64_t min_seq) {
    const int64_t seq = S.max_tokens(s) / s.micro;
    if (seq < s.seq && seq >= min_seq && seq >= 1) {
      what.push_back(fmt::format("max sequence length {}", seq));
      s.seq = seq;
      return true;
    }
    return false;
  };
  if (shorten(min_useful_seq_length(asked.seq))) {
    finish();
    return e;
  }
  if (s.mode == TrainMode::Full) {
    s.mode = TrainMode::Lora;
    what.push_back(fmt::format("LoRA (r={})", s.r));
    if (done()) {
      finish();
      return e;
    }
  }
  if (s.r > 1) {  // only when a lower r is enough: it barely changes the activations
    if (const int64_t r = largest_fitting_r(S, s); r > 0) {
      s.r = r;
      what.push_back(fmt::format("LoRA r={}", s.r));
      finish();
      return e;
    }
  }
  if (shorten(1)) {  // the last resort: as long as fits
    finish();
    return e;
  }
  // Nothing fits: the fix records the smallest setup tried (fits = false) so the caller can say
  // how far off it is.
  if (s.r > 1) {
    s.r = 1;
    what.push_back("LoRA r=1");
  }
  if (what.empty()) what.push_back("the requested settings");
  finish();
  return e;
}

nlohmann::json EstimateChange::to_json() const {
  return {{"kind", kind},
          {"description", description},
          {"flags", flags},
          {"gradient_checkpointing", gradient_checkpointing},
          {"mode", mode == TrainMode::Full ? "full" : "lora"},
          {"lora_r", lora_r},
          {"micro_batch_size", micro_batch_size},
          {"grad_accum", grad_accum},
          {"max_seq_length", max_seq_length},
          {"total_bytes", total},
          {"fits", fits}};
}

nlohmann::json Estimate::to_json() const {
  const EstimateRequest& r = request;
  nlohmann::json plan_json = plan.to_json();
  plan_json["weights_dtype"] = dtype_name(r.weights_dtype);
  plan_json["weights_f32"] = weights_f32;
  const bool lora = r.mode == TrainMode::Lora;
  nlohmann::json j = {
      {"settings",
       {{"mode", lora ? "lora" : "full"},
        {"lora_r", lora ? nlohmann::json(r.lora.r) : nlohmann::json(nullptr)},
        {"lora_dropout", lora ? nlohmann::json(r.lora.dropout) : nlohmann::json(nullptr)},
        {"target_modules", lora ? nlohmann::json(r.lora.resolved_targets()) : nlohmann::json(nullptr)},
        {"gradient_checkpointing", r.gradient_checkpointing},
        {"batch_size", r.batch_size},
        {"micro_batch_size", micro_batch_size},
        {"grad_accum", grad_accum},
        {"max_seq_length", r.max_seq_length},
        {"micro_batch_tokens", micro_batch_tokens},
        {"weights_dtype", dtype_name(r.weights_dtype)},
        {"matmul_dtype", dtype_name(r.mode == TrainMode::Full ? r.matmul_dtype : DType::F32)},
        {"cross_entropy_chunk_tokens", r.ce_chunk_tokens},
        {"device", r.device == DeviceType::CUDA ? "cuda" : "cpu"}}},
      {"base_parameters", base_parameters},
      {"active_parameters", active_parameters},
      {"plan", plan_json},
      {"limit_bytes", r.limit_bytes},
      {"fits", fits},
      {"headroom_bytes",
       fits ? static_cast<int64_t>(r.limit_bytes - plan.total()) : -static_cast<int64_t>(plan.total() - r.limit_bytes)},
      {"max_fit",
       {{"micro_batch_tokens", max_micro_batch_tokens},
        {"micro_batch_size", max_micro_batch_size},
        {"max_seq_length", max_seq_length},
        {"search_limit_reached", max_micro_batch_tokens >= kMaxSearchTokens}}},
  };
  nlohmann::json tried_json = nlohmann::json::array();
  for (const auto& c : tried) tried_json.push_back(c.to_json());
  j["changes_tried"] = tried_json;
  j["fix"] = has_fix ? fix.to_json() : nlohmann::json(nullptr);
  return j;
}

std::string group_digits(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string cross_entropy_chunk_arithmetic(int64_t micro_batch_tokens, int64_t vocab, int64_t chunk_tokens) {
  const int64_t rows = std::min(chunk_tokens, micro_batch_tokens);
  return fmt::format("{} tokens × {} vocab × {} bytes = {}", group_digits(rows), group_digits(vocab), sizeof(float),
                     format_bytes(linear_cross_entropy_workspace_bytes(micro_batch_tokens, vocab, chunk_tokens)));
}

}  // namespace bp
