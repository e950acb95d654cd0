// Analyzers of `backprop doctor`: the arithmetic the data file cannot express. Each one reads the
// numbers its entry extracted, writes findings that show their arithmetic, sets tags that select
// fixes ("when" in the data file) and a one-word verdict. Thresholds come from the entry's params.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "cli/doctor.h"
#include "cli/doctor_regex.h"

namespace bp::cli::doctor {

namespace {

std::optional<double> num(const nlohmann::json& numbers, const char* name) {
  if (!numbers.contains(name) || !numbers.at(name).contains("value")) return std::nullopt;
  return numbers.at(name).at("value").get<double>();
}
std::string text_of(const nlohmann::json& numbers, const char* name) {
  return numbers.contains(name) ? numbers.at(name).at("text").get<std::string>() : std::string();
}
std::string with_commas(long long v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string s = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
    s.push_back(digits[i]);
  }
  return s;
}
nlohmann::json derived_bytes(double bytes, const std::string& meaning) {
  return {{"text", bytes_text(bytes)}, {"value", std::llround(bytes)}, {"unit", "bytes"}, {"meaning", meaning}};
}
int trailing_zero_bits(long long v) {
  int n = 0;
  while (v > 0 && (v & 1) == 0 && n < 62) {
    v >>= 1;
    ++n;
  }
  return n;
}

// ---- logits-sized allocations ----------------------------------------------------------------------
// Is the failed allocation a [tokens x vocab] logits tensor? The printed size has two decimals, so it
// is only known to +-half a unit (0.005 GiB is 5.4 MB); any large size is "some tokens x vocab x
// bytes" for many vocabularies. So a claim needs evidence beyond the size: a shape [N, V] in the log
// whose product matches (exact), or a common vocabulary size written in the log, or words that point
// at the loss (logits, lm_head, cross_entropy), and then a token count that fits the rounding range.
void analyze_logits(const AnalyzerInput& in, AnalyzerOutput& out, const std::string& requested_text) {
  double req = 0, half = 0;
  if (!parse_bytes(requested_text, &req, &half)) return;
  const double lo = req - half - 0.5, hi = req + half + 0.5;
  const char* dtype_name[5] = {"", "", "bf16/fp16", "", "fp32"};
  static const Regex shape_re("\\[\\s*([0-9]+)\\s*,\\s*([0-9]+)\\s*(?:,\\s*([0-9]+)\\s*)?\\]");
  for (const auto& m : shape_re.find_all(in.text)) {
    std::vector<long long> dims;
    for (const auto& g : m.groups)
      if (g) dims.push_back(std::stoll(std::string(*g)));
    long long vocab = dims.back(), tokens = 1;
    for (size_t i = 0; i + 1 < dims.size(); ++i) tokens *= dims[i];
    if (vocab < 1000) continue;  // a vocabulary, not a hidden size of a tiny layer
    for (int b : {4, 2}) {
      double bytes = static_cast<double>(tokens) * static_cast<double>(vocab) * b;
      if (bytes < lo || bytes > hi) continue;
      out.tags.insert("logits");
      out.lines.push_back(fmt::format(
          "Logits-sized: {} = {} tokens x {} vocabulary x {} bytes ({}) = {} bytes; the shape {} is in the log. "
          "The loss materialises the full [tokens x vocab] logits (and their gradient of the same size).",
          requested_text, with_commas(tokens), with_commas(vocab), b, dtype_name[b], with_commas(std::llround(bytes)),
          std::string(in.text.substr(m.begin, m.end - m.begin))));
      out.derived["logits_tokens"] = {
          {"text", std::to_string(tokens)}, {"value", tokens}, {"meaning", "tokens in the logits tensor"}};
      out.derived["logits_vocab"] = {
          {"text", std::to_string(vocab)}, {"value", vocab}, {"meaning", "vocabulary size of the logits tensor"}};
      out.derived["logits_bytes_per_element"] = {
          {"text", std::to_string(b)}, {"value", b}, {"meaning", "bytes per logit (4 = fp32, 2 = bf16/fp16)"}};
      return;
    }
  }
  static const Regex loss_words("(?i)lm_head|logits|cross_entropy|log_softmax|CrossEntropyLoss|vocab");
  bool loss_context = loss_words.find(in.text).has_value();
  struct Candidate {
    long long vocab, tokens;
    int bytes, roundness;
    bool vocab_in_log;
  };
  std::optional<Candidate> best;
  std::vector<long long> vocabs;
  if (in.params.is_object() && in.params.contains("vocab_sizes"))
    for (const auto& v : in.params.at("vocab_sizes")) vocabs.push_back(v.get<long long>());
  for (long long v : vocabs) {
    bool in_log = Regex("(?<![0-9])" + std::to_string(v) + "(?![0-9])").find(in.text).has_value();
    if (!in_log && !loss_context) continue;
    for (int b : {4, 2}) {
      double per_token = static_cast<double>(v) * b;
      long long t_lo = static_cast<long long>(std::ceil(lo / per_token));
      long long t_hi = static_cast<long long>(std::floor(hi / per_token));
      if (t_lo < 1 || t_lo > t_hi) continue;
      long long pick = t_lo;
      int round = trailing_zero_bits(t_lo);
      for (long long t = t_lo; t <= t_hi && t - t_lo < 100000; ++t)
        if (trailing_zero_bits(t) > round) {
          round = trailing_zero_bits(t);
          pick = t;
        }
      Candidate c{v, pick, b, round, in_log};
      // A vocabulary named in the log wins; then a rounder token count (multiples of 1024 count as
      // equally round); then fp32, the dtype losses usually upcast logits to.
      auto better = [](const Candidate& a, const Candidate& o) {
        if (a.vocab_in_log != o.vocab_in_log) return a.vocab_in_log;
        int ra = std::min(a.roundness, 10), ro = std::min(o.roundness, 10);
        if (ra != ro) return ra > ro;
        return a.bytes > o.bytes;
      };
      if (!best || better(c, *best)) best = c;
    }
  }
  // Without the vocabulary in the log, only a round token count (a multiple of 256, as batch x
  // sequence length usually is) is worth mentioning.
  if (!best || (!best->vocab_in_log && best->roundness < 8)) return;
  double bytes = static_cast<double>(best->tokens) * static_cast<double>(best->vocab) * best->bytes;
  out.tags.insert("logits");
  out.lines.push_back(fmt::format(
      "Possibly logits: {} ~ {} tokens x {} vocabulary x {} bytes ({}) = {} bytes ({}). {}", requested_text,
      with_commas(best->tokens), with_commas(best->vocab), best->bytes, dtype_name[best->bytes],
      with_commas(std::llround(bytes)), bytes_text(bytes),
      best->vocab_in_log ? "That vocabulary size appears in the log." : "The log mentions the loss / logits."));
  out.derived["logits_tokens"] = {{"text", std::to_string(best->tokens)},
                                  {"value", best->tokens},
                                  {"meaning", "tokens in the logits tensor (estimated from the size)"}};
  out.derived["logits_vocab"] = {{"text", std::to_string(best->vocab)},
                                 {"value", best->vocab},
                                 {"meaning", "vocabulary size assumed for the logits tensor"}};
}

// ---- CUDA / allocator out of memory ---------------------------------------------------------------
void cuda_oom(const AnalyzerInput& in, AnalyzerOutput& out) {
  const auto& n = in.numbers;
  auto req = num(n, "requested"), total = num(n, "total_capacity"), free = num(n, "free");
  auto alloc = num(n, "allocated"), reserved = num(n, "reserved"), unalloc = num(n, "reserved_unallocated");
  auto limit = num(n, "limit");
  double min_share = in.params.is_object() ? in.params.value("fragmentation_min_share", 0.2) : 0.2;

  if (!reserved && alloc && unalloc) {
    reserved = *alloc + *unalloc;
    out.derived["reserved"] = derived_bytes(*reserved, "reserved = allocated + reserved but unallocated");
  }
  if (reserved && alloc && !unalloc) {
    unalloc = std::max(0.0, *reserved - *alloc);
    out.derived["reserved_unallocated"] = derived_bytes(*unalloc, "reserved - allocated: cached, not used by tensors");
  }
  if (req && total)
    out.lines.push_back(fmt::format("Tried to allocate {} on a device of {} ({:.1f}% of the device in one request).",
                                    bytes_text(*req), bytes_text(*total), 100.0 * *req / *total));
  if (reserved && alloc && unalloc)
    out.lines.push_back(fmt::format(
        "Reserved {} - allocated {} = {} cached but not used by tensors ({:.0f}% of what the allocator holds).",
        bytes_text(*reserved), bytes_text(*alloc), bytes_text(*unalloc),
        *reserved > 0 ? 100.0 * *unalloc / *reserved : 0.0));
  if (limit) {
    out.tags.insert("budget");
    out.lines.push_back(fmt::format(
        "The allocator's limit was {} (backprop's --max-memory budget or the GPU's free memory).", bytes_text(*limit)));
  }
  if (alloc && total && *alloc > *total)
    out.lines.push_back(fmt::format(
        "Allocated ({}) is more than the device's total ({}): the numbers describe different memory (for example "
        "Windows lets the driver spill into shared system memory), so read the totals with care.",
        bytes_text(*alloc), bytes_text(*total)));
  if (n.contains("other_processes") && n.at("other_processes").value("count", 0) >= 2) {
    out.tags.insert("other_processes");
    out.lines.push_back(
        fmt::format("{} processes hold {} on this GPU between them (the failing process may be one "
                    "of them): the GPU is shared.",
                    n.at("other_processes").at("count").get<int>(), bytes_text(*num(n, "other_processes"))));
  }

  if (req && total && *req > *total) {
    out.verdict = "larger_than_device";
    out.tags.insert("exhaustion");
    out.lines.push_back(fmt::format(
        "Verdict: this single allocation ({}) is larger than the whole device ({}). No allocator setting can make it "
        "fit; the tensor itself must get smaller (fewer tokens per micro-batch, chunked loss).",
        bytes_text(*req), bytes_text(*total)));
  } else if (req && free && *free >= *req) {
    // The driver could have served the request directly, so the caching allocator's cache is not
    // what failed.
    out.verdict = "free_exceeds_request";
    out.tags.insert("exhaustion");
    out.tags.insert("free_exceeds_request");
    out.lines.push_back(fmt::format(
        "Verdict: the driver still reported {} free, more than the {} request, yet the allocation failed: a "
        "per-process limit (a memory fraction, --max-memory), another process allocating at the same moment, or "
        "fragmentation of the device's own address space (common on Windows) is blocking it.",
        bytes_text(*free), bytes_text(*req)));
  } else if (req && unalloc && reserved) {
    double f = free.value_or(0.0);
    double share = *reserved > 0 ? *unalloc / *reserved : 0.0;
    bool fits_defragmented = *unalloc + f >= *req;
    if (share >= min_share && fits_defragmented) {
      out.verdict = "fragmentation";
      out.tags.insert("fragmentation");
      out.lines.push_back(fmt::format(
          "Verdict: fragmentation. Cached-but-unused {} + free {} = {} would hold the {} request, but not as one "
          "contiguous block ({:.0f}% of the reserved memory is cached, threshold {:.0f}%).",
          bytes_text(*unalloc), bytes_text(f), bytes_text(*unalloc + f), bytes_text(*req), 100.0 * share,
          100.0 * min_share));
    } else {
      out.verdict = "exhaustion";
      out.tags.insert("exhaustion");
      if (share >= min_share) {
        out.tags.insert("fragmentation");
        out.lines.push_back(fmt::format(
            "Verdict: true exhaustion, with a large cache. Even defragmented, cached {} + free {} = {} is {} short of "
            "the {} request; expandable segments would recover part of it, the rest must come from a smaller step.",
            bytes_text(*unalloc), bytes_text(f), bytes_text(*unalloc + f), bytes_text(*req - *unalloc - f),
            bytes_text(*req)));
      } else {
        out.lines.push_back(fmt::format(
            "Verdict: true exhaustion. Only {} is cached-but-unused ({:.0f}% of reserved, under the {:.0f}% that "
            "points at fragmentation) and {} is free: the request does not fit.",
            bytes_text(*unalloc), 100.0 * share, 100.0 * min_share, bytes_text(f)));
      }
    }
  } else {
    out.verdict = "exhaustion";
    out.tags.insert("exhaustion");
    out.lines.push_back(
        "Verdict: out of memory; the message lacks the allocator statistics needed to tell "
        "fragmentation from exhaustion, so treat it as exhaustion.");
  }
  if (n.contains("requested")) analyze_logits(in, out, text_of(n, "requested"));
}

// ---- table lookup ----------------------------------------------------------------------------------
void lookup(const AnalyzerInput& in, AnalyzerOutput& out) {
  if (!in.params.is_object()) return;
  std::string name = in.params.value("number", "");
  if (!in.numbers.contains(name)) return;
  std::string value = in.numbers.at(name).at("text").get<std::string>();
  bool prefix = in.params.value("prefix_match", false);
  for (auto it = in.params.at("table").begin(); it != in.params.at("table").end(); ++it) {
    bool hit = prefix ? value.rfind(it.key(), 0) == 0 : value == it.key();
    if (hit) {
      out.lines.push_back(it.value().get<std::string>());
      out.verdict = it.key();
      return;
    }
  }
}

// ---- NaN / inf loss -----------------------------------------------------------------------------------
void nan_loss(const AnalyzerInput& in, AnalyzerOutput& out) {
  std::string fp16 = in.params.is_object() ? in.params.value("fp16_markers", "") : "";
  std::string bf16 = in.params.is_object() ? in.params.value("bf16_markers", "") : "";
  double high_lr = in.params.is_object() ? in.params.value("high_lr_lora", 1e-3) : 1e-3;
  std::optional<RegexMatch> fp16_hit, bf16_hit;
  if (!fp16.empty()) fp16_hit = Regex(fp16).find(in.text);
  if (!bf16.empty()) bf16_hit = Regex(bf16).find(in.text);
  auto lr = num(in.numbers, "learning_rate");
  if (fp16_hit) {
    out.tags.insert("fp16");
    out.verdict = "fp16_overflow";
    out.lines.push_back(fmt::format(
        "fp16 is in use (the log says '{}'): values above 65504 overflow to inf in half precision; this is the first "
        "suspect. bf16 has the range of fp32.",
        std::string(in.text.substr(fp16_hit->begin, fp16_hit->end - fp16_hit->begin))));
  } else if (bf16_hit) {
    out.lines.push_back("bf16 is in use: overflow is unlikely; look at the learning rate and the data.");
  }
  if (lr) {
    if (*lr > high_lr) {
      out.tags.insert("high_lr");
      if (out.verdict.empty()) out.verdict = "learning_rate";
      out.lines.push_back(
          fmt::format("Learning rate {} is above {}: high for LoRA (usually 1e-4 to 2e-4) and very high "
                      "for full fine-tuning (1e-5 to 5e-5).",
                      text_of(in.numbers, "learning_rate"), high_lr));
    } else {
      out.lines.push_back(fmt::format("Learning rate {} is in the usual range: suspect precision or data first.",
                                      text_of(in.numbers, "learning_rate")));
    }
  }
  if (out.verdict.empty()) {
    out.verdict = "data_or_unknown";
    out.lines.push_back(
        "The log shows neither fp16 nor a high learning rate: check the samples around the failing "
        "step (empty label masks, corrupted text) and clip gradients.");
  }
}

// ---- fp16 loss scale ----------------------------------------------------------------------------------
void loss_scale(const AnalyzerInput& in, AnalyzerOutput& out) {
  auto scale = num(in.numbers, "loss_scale");
  auto count = num(in.numbers, "overflow_steps").value_or(0);
  if (scale && *scale < 1.0) {
    out.tags.insert("collapsed");
    out.verdict = "collapsed";
    out.lines.push_back(
        fmt::format("The loss scale fell to {} after {} overflow(s) in this log: a scale below 1 means every step "
                    "overflows, so the "
                    "model produces inf/NaN in fp16 by itself; loss scaling cannot fix it.",
                    text_of(in.numbers, "loss_scale"), count));
  } else {
    out.tags.insert("settling");
    out.verdict = "settling";
    out.lines.push_back(fmt::format("{} overflow(s), loss scale {}: dynamic loss scaling is finding its level.", count,
                                    scale ? text_of(in.numbers, "loss_scale") : std::string("unknown")));
  }
}

// ---- NCCL watchdog timeout ----------------------------------------------------------------------------
void nccl_timeout(const AnalyzerInput& in, AnalyzerOutput& out) {
  const auto& n = in.numbers;
  auto timeout = num(n, "timeout_ms"), ran = num(n, "ran_for_ms"), numel = num(n, "numel");
  if (timeout)
    out.lines.push_back(fmt::format("Timeout(ms)={} is {:.1f} minutes{}.", text_of(n, "timeout_ms"), *timeout / 60000.0,
                                    ran ? fmt::format("; the collective waited {:.1f} minutes ({} ms over the limit)",
                                                      *ran / 60000.0, std::llround(*ran - *timeout))
                                        : std::string()));
  if (n.contains("op_type"))
    out.lines.push_back(
        fmt::format("The stuck collective is {}{}.", text_of(n, "op_type"),
                    numel ? fmt::format(" of {} elements ({} in fp32, {} in bf16)", with_commas(std::llround(*numel)),
                                        bytes_text(*numel * 4), bytes_text(*numel * 2))
                          : std::string()));
  if (n.contains("seq_num") && n.contains("last_completed"))
    out.lines.push_back(
        fmt::format("Ranks waited at collective #{} after completing #{}: every rank got that far; the "
                    "rank that did not enter #{} is the one to look at.",
                    text_of(n, "seq_num"), text_of(n, "last_completed"), text_of(n, "seq_num")));
  if (n.contains("ranks_reporting"))
    out.lines.push_back(
        fmt::format("Ranks whose watchdog fired in this log: {} ({}). Ranks missing from this list are "
                    "either fine or the ones that hung; check their logs.",
                    n.at("ranks_reporting").at("count").get<int>(), text_of(n, "ranks_reporting")));
  out.verdict = "collective_timeout";
}

// ---- process group: ranks that did not check in ------------------------------------------------------
void ranks(const AnalyzerInput& in, AnalyzerOutput& out) {
  auto world = num(in.numbers, "world_size"), workers = num(in.numbers, "worker_count");
  if (!world || !workers) return;
  long long w = std::llround(*world), k = std::llround(*workers);
  if (k < w) {
    out.verdict = "ranks_missing";
    out.lines.push_back(
        fmt::format("Only {} of {} ranks checked in: {} never arrived (crashed, not launched, or "
                    "pointed at another MASTER_ADDR / port).",
                    k, w, w - k));
  } else if (k > w) {
    out.verdict = "too_many_workers";
    out.lines.push_back(fmt::format(
        "{} workers checked in for a world of {}: leftover processes of an earlier launch, or two jobs sharing one "
        "MASTER_PORT (older PyTorch also counts workers across process groups, so a retry can show this).",
        k, w));
  }
}

// ---- driver version -------------------------------------------------------------------------------------
void driver_version(const AnalyzerInput& in, AnalyzerOutput& out) {
  auto v = num(in.numbers, "driver_cuda_version");
  if (!v) return;
  long long x = std::llround(*v);
  out.lines.push_back(
      fmt::format("The driver supports CUDA up to {}.{} (found version {} = 1000 x {} + 10 x {}); the "
                  "program needs a newer CUDA runtime than that.",
                  x / 1000, (x % 1000) / 10, x, x / 1000, (x % 1000) / 10));
  out.derived["driver_cuda"] = {{"text", fmt::format("{}.{}", x / 1000, (x % 1000) / 10)},
                                {"meaning", "highest CUDA version the driver supports"}};
  out.verdict = "driver_too_old";
}

// ---- XLA compilations -------------------------------------------------------------------------------------
void xla(const AnalyzerInput& in, AnalyzerOutput& out) {
  auto comps = num(in.numbers, "compilations"), step = num(in.numbers, "step");
  if (comps && step && *step > 0) {
    double per_step = *comps / *step;
    out.lines.push_back(
        fmt::format("{} graphs compiled by step {} ({:.1f} per step): a steady training loop compiles "
                    "a handful of graphs in its first steps and then none.",
                    std::llround(*comps), std::llround(*step), per_step));
    out.verdict = per_step > 2 ? "recompilation_storm" : "normal";
  } else if (comps) {
    out.lines.push_back(
        fmt::format("{} graphs compiled so far; if this number keeps growing every step, shapes change "
                    "from step to step.",
                    std::llround(*comps)));
    out.verdict = *comps >= 50 ? "recompilation_storm" : "unknown";
  }
  if (in.numbers.contains("longest_compile")) {
    out.lines.push_back(fmt::format("The slowest compilation took {}.", text_of(in.numbers, "longest_compile")));
    if (out.verdict.empty()) out.verdict = "slow_compilation";
  }
}

// ---- Hugging Face repository ids -----------------------------------------------------------------------
void hf_repo(const AnalyzerInput& in, AnalyzerOutput& out) {
  std::string repo = text_of(in.numbers, "repo");
  if (repo.empty()) return;
  if (repo.find('/') == std::string::npos) {
    out.verdict = "missing_owner";
    out.lines.push_back(
        fmt::format("'{}' has no owner part: Hub model ids are owner/name (or it was meant as a local "
                    "folder that does not exist).",
                    repo));
  } else {
    out.verdict = "not_found";
    out.lines.push_back(fmt::format("'{}' was looked up on the Hub and does not exist there (or is private).", repo));
  }
}

struct Named {
  const char* name;
  AnalyzerFn fn;
};
constexpr Named kAnalyzers[] = {{"cuda_oom", cuda_oom},
                                {"lookup", lookup},
                                {"nan_loss", nan_loss},
                                {"loss_scale", loss_scale},
                                {"nccl_timeout", nccl_timeout},
                                {"ranks", ranks},
                                {"driver_version", driver_version},
                                {"xla", xla},
                                {"hf_repo", hf_repo}};

}  // namespace

AnalyzerFn find_analyzer(std::string_view name) {
  for (const auto& a : kAnalyzers)
    if (name == a.name) return a.fn;
  return nullptr;
}

std::vector<std::string> analyzer_names() {
  std::vector<std::string> v;
  for (const auto& a : kAnalyzers) v.push_back(a.name);
  return v;
}

}  // namespace bp::cli::doctor
