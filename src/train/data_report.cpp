// `backprop data report` / `data split` (contract: train/data_report.h).
#include "train/data_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <unordered_map>

#include "core/error.h"
#include "io/atomic_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp {

namespace {

// The text two rows are compared by: every message's role and content (a pair: its prompt,
// chosen and rejected completions), or a text row's text.
std::string row_text(const DatasetRow& r) {
  if (r.is_text) return r.text;
  std::string s;
  // Tool calls, reasoning and tools are part of what a row teaches: rows differing there differ.
  if (r.conv.tools.is_array()) s += "tools\n" + r.conv.tools.dump() + "\n";
  for (const ChatMessage& m : r.conv)
    s += m.role + "\n" + m.content + "\n" + (m.extra.is_object() ? m.extra.dump() + "\n" : "");
  if (r.is_pair()) s += "rejected\n" + r.rejected_conv.back().content + "\n";
  return s;
}

int64_t utf8_chars(const DatasetRow& r) {
  auto count = [](const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  if (r.is_text) return count(r.text);
  int64_t a = 0, b = 0;
  for (const ChatMessage& m : r.conv) a += count(m.content);
  for (const ChatMessage& m : r.rejected_conv) b += count(m.content);
  return std::max(a, b);  // a pair's longer sequence
}

uint64_t text_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<std::pair<int64_t, int64_t>> histogram_bounds(int64_t max_len) {
  std::vector<std::pair<int64_t, int64_t>> h;
  for (int64_t b = 16; b < max_len; b *= 2) h.emplace_back(b, 0);
  h.emplace_back(max_len, 0);
  h.emplace_back(-1, 0);  // above max_seq_length
  return h;
}

void count_length(std::vector<std::pair<int64_t, int64_t>>& h, int64_t len) {
  for (auto& [bound, n] : h)
    if (bound < 0 || len <= bound) {
      ++n;
      return;
    }
}

// A file's rows as the report sees them: the good rows, their texts and lengths, and the per-row
// findings (bad_row, empty_target, too_long).
struct FileScan {
  LoadedDataset ds;
  std::vector<std::string> texts;  // of ds.rows
  DataFileSummary summary;
};

FileScan scan_file(const std::string& path, const DataReportOptions& o, const Tokenizer* tok, const ChatTemplate* tmpl,
                   std::vector<DataFinding>& findings) {
  FileScan f;
  DatasetLoadOptions lo;
  lo.format = o.format;  // no length check here: every good row is kept, its length measured below
  o.chat.apply(lo);
  f.ds = load_dataset(path, lo);
  f.summary.path = path;
  f.summary.format = dataset_format_name(f.ds.format);
  f.summary.rows = f.ds.total_rows;
  f.summary.good_rows = static_cast<int64_t>(f.ds.rows.size());
  f.summary.length_unit = tok ? "tokens" : "characters";
  f.summary.histogram = histogram_bounds(o.max_seq_length);
  for (const RowIssue& i : f.ds.issues) {
    const bool empty = i.problem == RowProblem::EmptyTurn || i.problem == RowProblem::EmptyCompletion;
    findings.push_back({empty ? "empty_target" : "bad_row", path, i.line, 0, 0,
                        fmt::format("{}: {}", row_problem_name(i.problem), i.message)});
  }
  f.texts.reserve(f.ds.rows.size());
  for (const DatasetRow& r : f.ds.rows) f.texts.push_back(row_text(r));
  const int64_t max_len = o.max_seq_length;
  if (tok) {
    // Whole rows (no truncation), so lengths are exact and the mask is the one training builds.
    const TokenizedDataset td = tokenize_dataset(f.ds, *tok, *tmpl, {.max_seq_length = int64_t{1} << 40});
    for (const RowIssue& i : td.issues)
      findings.push_back(
          {i.problem == RowProblem::RejectedByTemplate && i.message.find("marks no token") == std::string::npos
               ? "bad_row"
               : "empty_target",
           path, i.line, 0, 0,
           i.problem == RowProblem::RejectedByTemplate ? i.message : "the loss mask leaves no token to train on"});
    for (const Sample& s : td.samples) {
      const int64_t len = static_cast<int64_t>(std::max(s.ids.size(), s.rejected_ids.size()));
      f.summary.total_length += len;
      f.summary.max_length = std::max(f.summary.max_length, len);
      count_length(f.summary.histogram, len);
      if (len <= max_len) continue;
      // A target at position 0 has no context; training needs one in [1, max_seq_length).
      auto trains_within = [&](const std::vector<uint8_t>& mask) {
        if (mask.empty()) return true;  // no rejected sequence
        const auto end = mask.begin() + std::min<int64_t>(max_len, static_cast<int64_t>(mask.size()));
        return std::count(mask.begin() + 1, end, 1) > 0;
      };
      const bool kept = trains_within(s.loss_mask) && trains_within(s.rejected_loss_mask);
      findings.push_back({"too_long", path, s.source_line, 0, 0,
                          fmt::format("{} tokens, longer than max_seq_length {}: {}", len, max_len,
                                      kept ? "training keeps its start"
                                           : "its trained part lies past the limit, so "
                                             "training skips it")});
    }
  } else {
    for (const DatasetRow& r : f.ds.rows) {
      const int64_t len = utf8_chars(r);
      f.summary.total_length += len;
      f.summary.max_length = std::max(f.summary.max_length, len);
      const int64_t est_tokens = (len + 3) / 4;
      count_length(f.summary.histogram, est_tokens);
      if (est_tokens > max_len)
        findings.push_back({"too_long", path, r.line, 0, 0,
                            fmt::format("{} characters, about {} tokens at 4 per token (pass --model for exact "
                                        "counts), longer than max_seq_length {}",
                                        len, est_tokens, max_len)});
    }
  }
  return f;
}

std::vector<MinHashSignature> signatures(const std::vector<std::string>& texts, const MinHashOptions& m) {
  std::vector<MinHashSignature> sigs;
  sigs.reserve(texts.size());
  for (const std::string& t : texts) sigs.push_back(minhash_signature(shingle_hashes(t, m.shingle_words), m));
  return sigs;
}

// For each row, the earliest earlier row with the same text (-1 when none).
std::vector<int64_t> exact_duplicates(const std::vector<std::string>& texts) {
  std::unordered_map<uint64_t, std::vector<int64_t>> first;
  std::vector<int64_t> dup(texts.size(), -1);
  for (size_t i = 0; i < texts.size(); ++i) {
    auto& seen = first[text_hash(texts[i])];
    for (int64_t j : seen)
      if (texts[static_cast<size_t>(j)] == texts[i]) {
        dup[i] = j;
        break;
      }
    if (dup[i] < 0) seen.push_back(static_cast<int64_t>(i));
  }
  return dup;
}

void check_options(const MinHashOptions& m, double threshold) {
  if (!(threshold > 0.0 && threshold <= 1.0))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[data] the near-duplicate threshold must be in (0, 1], got {}", threshold));
  if (m.num_hashes <= 0 || m.bands <= 0 || m.num_hashes % m.bands != 0)
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[data] MinHash bands must divide the number of hashes");
}

}  // namespace

const std::vector<std::string>& data_finding_kinds() {
  static const std::vector<std::string> k = {"bad_row",        "empty_target",  "too_long",          "duplicate",
                                             "near_duplicate", "contamination", "near_contamination"};
  return k;
}

DataReport build_data_report(const DataReportOptions& o) {
  check_options(o.minhash, o.near_threshold);
  if (o.max_seq_length <= 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[data] --max-seq-length must be > 0, got {}", o.max_seq_length));
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  if (!o.model_dir.empty()) {
    tok = Tokenizer::from_dir(o.model_dir);
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer(*tok, o.chat_template));
    o.chat.apply(*tmpl);
  }
  DataReport rep;
  rep.max_seq_length = o.max_seq_length;
  rep.near_threshold = o.near_threshold;
  std::vector<DataFinding> found;
  FileScan train = scan_file(o.file, o, tok.get(), tmpl.get(), found);
  rep.train = train.summary;

  // Duplicates within the training file: exact first, then near (each row once, naming the
  // earliest row it repeats).
  const std::vector<int64_t> dup = exact_duplicates(train.texts);
  const auto& rows = train.ds.rows;
  for (size_t i = 0; i < rows.size(); ++i)
    if (dup[i] >= 0)
      found.push_back({"duplicate", o.file, rows[i].line, rows[static_cast<size_t>(dup[i])].line, 1.0,
                       fmt::format("the same row as line {}", rows[static_cast<size_t>(dup[i])].line)});
  std::vector<MinHashSignature> sigs = signatures(train.texts, o.minhash);
  {
    std::vector<int64_t> near(rows.size(), -1);
    std::vector<double> sim(rows.size(), 0.0);
    for (const auto& [a, b] : lsh_candidate_pairs(sigs, o.minhash)) {
      const double j = estimated_jaccard(sigs[static_cast<size_t>(a)], sigs[static_cast<size_t>(b)]);
      if (j < o.near_threshold || dup[static_cast<size_t>(b)] >= 0) continue;
      const size_t later = static_cast<size_t>(b);
      if (near[later] < 0 || a < near[later]) {
        near[later] = a;
        sim[later] = j;
      }
    }
    for (size_t i = 0; i < rows.size(); ++i)
      if (near[i] >= 0)
        found.push_back({"near_duplicate", o.file, rows[i].line, rows[static_cast<size_t>(near[i])].line, sim[i],
                         fmt::format("about {:.0f}% the same words as line {} (estimated Jaccard {:.2f})", 100 * sim[i],
                                     rows[static_cast<size_t>(near[i])].line, sim[i])});
  }

  if (!o.eval_file.empty()) {
    FileScan ev = scan_file(o.eval_file, o, tok.get(), tmpl.get(), found);
    rep.eval = ev.summary;
    std::unordered_map<uint64_t, std::vector<int64_t>> by_hash;
    for (size_t i = 0; i < train.texts.size(); ++i)
      by_hash[text_hash(train.texts[i])].push_back(static_cast<int64_t>(i));
    const size_t n_train = sigs.size();
    std::vector<int64_t> exact(ev.texts.size(), -1), near(ev.texts.size(), -1);
    std::vector<double> sim(ev.texts.size(), 0.0);
    for (size_t e = 0; e < ev.texts.size(); ++e) {
      auto it = by_hash.find(text_hash(ev.texts[e]));
      if (it == by_hash.end()) continue;
      for (int64_t t : it->second)
        if (train.texts[static_cast<size_t>(t)] == ev.texts[e]) {
          exact[e] = t;
          break;
        }
    }
    for (auto& s : signatures(ev.texts, o.minhash)) sigs.push_back(std::move(s));
    for (const auto& [a, b] : lsh_candidate_pairs(sigs, o.minhash)) {
      if (static_cast<size_t>(a) >= n_train || static_cast<size_t>(b) < n_train) continue;  // one of each file
      const size_t e = static_cast<size_t>(b) - n_train;
      if (exact[e] >= 0) continue;
      const double j = estimated_jaccard(sigs[static_cast<size_t>(a)], sigs[static_cast<size_t>(b)]);
      if (j >= o.near_threshold && (j > sim[e] || (j == sim[e] && a < near[e]))) {
        near[e] = a;
        sim[e] = j;
      }
    }
    const auto& erows = ev.ds.rows;
    for (size_t e = 0; e < erows.size(); ++e) {
      if (exact[e] >= 0)
        found.push_back(
            {"contamination", o.eval_file, erows[e].line, rows[static_cast<size_t>(exact[e])].line, 1.0,
             fmt::format("the same row as line {} of {}", rows[static_cast<size_t>(exact[e])].line, o.file)});
      else if (near[e] >= 0)
        found.push_back({"near_contamination", o.eval_file, erows[e].line, rows[static_cast<size_t>(near[e])].line,
                         sim[e],
                         fmt::format("about {:.0f}% the same words as line {} of {} (estimated Jaccard {:.2f})",
                                     100 * sim[e], rows[static_cast<size_t>(near[e])].line, o.file, sim[e])});
    }
  }
  // Report order: kind, then file (training first), then line.
  const auto& kinds = data_finding_kinds();
  auto rank = [&](const DataFinding& f) {
    return std::make_tuple(std::find(kinds.begin(), kinds.end(), f.kind) - kinds.begin(), f.file != o.file, f.line);
  };
  std::stable_sort(found.begin(), found.end(),
                   [&](const DataFinding& a, const DataFinding& b) { return rank(a) < rank(b); });
  rep.findings = std::move(found);
  return rep;
}

std::map<std::string, int64_t> DataReport::counts() const {
  std::map<std::string, int64_t> c;
  for (const std::string& k : data_finding_kinds()) c[k] = 0;
  for (const DataFinding& f : findings) ++c[f.kind];
  return c;
}

namespace {
nlohmann::ordered_json summary_json(const DataFileSummary& s) {
  nlohmann::ordered_json h = nlohmann::ordered_json::array();
  for (const auto& [bound, n] : s.histogram)
    h.push_back({{"up_to", bound < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(bound)}, {"rows", n}});
  return {{"path", s.path},
          {"format", s.format},
          {"rows", s.rows},
          {"good_rows", s.good_rows},
          {"length_unit", s.length_unit},
          {"total_length", s.total_length},
          {"max_length", s.max_length},
          {"histogram", h}};
}

std::string summary_text(const DataFileSummary& s, int64_t max_seq_length) {
  std::string out = fmt::format("{}: {} rows ({} format), {} good; {} {} in all, longest {}\n", s.path, s.rows,
                                s.format, s.good_rows, s.total_length, s.length_unit, s.max_length);
  out += fmt::format("  lengths ({}{}):", s.length_unit == "tokens" ? "tokens" : "estimated tokens",
                     s.length_unit == "tokens" ? "" : ", 4 characters each");
  for (const auto& [bound, n] : s.histogram)
    out += bound < 0 ? fmt::format("  >{}: {}", max_seq_length, n) : fmt::format("  <={}: {}", bound, n);
  return out + "\n";
}
}  // namespace

nlohmann::ordered_json DataReport::to_json(int64_t max_findings) const {
  nlohmann::ordered_json j;
  j["train"] = summary_json(train);
  if (eval) j["eval"] = summary_json(*eval);
  j["max_seq_length"] = max_seq_length;
  j["near_duplicate_threshold"] = near_threshold;
  nlohmann::ordered_json c = nlohmann::ordered_json::object();
  for (const std::string& k : data_finding_kinds()) c[k] = counts().at(k);
  j["counts"] = c;
  nlohmann::ordered_json f = nlohmann::ordered_json::array();
  for (const DataFinding& x : findings) {
    if (max_findings >= 0 && static_cast<int64_t>(f.size()) >= max_findings) break;
    nlohmann::ordered_json e = {{"kind", x.kind}, {"file", x.file}, {"line", x.line}};
    if (x.other_line) e["other_line"] = x.other_line;
    if (x.kind.rfind("near_", 0) == 0) e["similarity"] = x.similarity;
    e["message"] = x.message;
    f.push_back(e);
  }
  j["findings"] = f;
  j["findings_total"] = findings.size();
  return j;
}

std::string DataReport::to_text(int64_t max_findings) const {
  std::string out = summary_text(train, max_seq_length);
  if (eval) out += "eval " + summary_text(*eval, max_seq_length);
  const auto c = counts();
  out += "findings:";
  for (const std::string& k : data_finding_kinds()) out += fmt::format(" {} {}", k, c.at(k));
  out += "\n";
  int64_t shown = 0;
  for (const DataFinding& f : findings) {
    if (max_findings >= 0 && shown >= max_findings) break;
    out += fmt::format("{}:{}: {}: {}\n", f.file, f.line, f.kind, f.message);
    ++shown;
  }
  if (static_cast<int64_t>(findings.size()) > shown)
    out += fmt::format("... {} more findings not shown (raise --max-findings, or --json)\n",
                       static_cast<int64_t>(findings.size()) - shown);
  if (findings.empty()) out += "OK: nothing found\n";
  return out;
}

DataSplitResult split_dataset(const DataSplitOptions& o) {
  check_options(o.minhash, o.near_threshold);
  if (!(o.eval_fraction > 0.0 && o.eval_fraction < 1.0))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[data] --eval-fraction must be in (0, 1), got {}", o.eval_fraction));
  std::ifstream in(o.file, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND, fmt::format("[data] cannot read {}", o.file))
        .with_suggestion("Check the path.");
  std::vector<std::string> lines;  // 1-based line k is lines[k - 1]
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const auto first = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find_first_not_of(" \t\r") != std::string::npos;
  });
  const bool jsonl = first != lines.end() && (*first)[first->find_first_not_of(" \t\r")] == '{';
  if (!jsonl || (o.file.size() >= 4 && o.file.compare(o.file.size() - 4, 4, ".txt") == 0))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[data] split writes JSONL rows back as they are; {} is not JSONL (one JSON object per "
                            "line)",
                            o.file))
        .with_suggestion("Convert it to JSONL first (one object per line), or split with --holdout at training.");
  DatasetLoadOptions lo;
  lo.columns = o.columns;
  const LoadedDataset ds = load_dataset(o.file, lo);
  std::vector<std::string> texts;
  for (const DatasetRow& r : ds.rows) texts.push_back(row_text(r));
  const size_t n = texts.size();
  if (n < 2)
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[data] {} has {} good rows: nothing to split", o.file, n));
  // Groups: exact and near duplicates joined (union-find), so a group lands on one side whole.
  std::vector<int64_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int64_t x) {
    while (parent[static_cast<size_t>(x)] != x)
      x = parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  };
  auto join = [&](int64_t a, int64_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[static_cast<size_t>(std::max(a, b))] = std::min(a, b);
  };
  const std::vector<int64_t> dup = exact_duplicates(texts);
  for (size_t i = 0; i < n; ++i)
    if (dup[i] >= 0) join(static_cast<int64_t>(i), dup[i]);
  const std::vector<MinHashSignature> sigs = signatures(texts, o.minhash);
  for (const auto& [a, b] : lsh_candidate_pairs(sigs, o.minhash))
    if (estimated_jaccard(sigs[static_cast<size_t>(a)], sigs[static_cast<size_t>(b)]) >= o.near_threshold) join(a, b);
  std::map<int64_t, std::vector<int64_t>> groups;  // root -> rows
  for (size_t i = 0; i < n; ++i) groups[find(static_cast<int64_t>(i))].push_back(static_cast<int64_t>(i));
  // A seeded order of the groups (a hash of seed and root: the same for the same file and seed).
  std::vector<std::pair<uint64_t, int64_t>> order;
  for (const auto& [root, members] : groups) {
    uint64_t h = o.seed ^ (static_cast<uint64_t>(root) * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    order.emplace_back(h, root);
  }
  std::sort(order.begin(), order.end());
  const auto target =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(o.eval_fraction * static_cast<double>(n))));
  std::vector<char> to_eval(lines.size() + 1, 0);  // by line
  DataSplitResult res;
  for (const auto& [h, root] : order) {
    const auto& members = groups[root];
    if (members.size() > 1) {
      ++res.groups;
      res.grouped_rows += static_cast<int64_t>(members.size());
    }
    if (res.eval_rows >= target || res.eval_rows + static_cast<int64_t>(members.size()) > static_cast<int64_t>(n) - 1)
      continue;
    for (int64_t m : members) to_eval[static_cast<size_t>(ds.rows[static_cast<size_t>(m)].line)] = 1;
    res.eval_rows += static_cast<int64_t>(members.size());
  }
  std::string stem = o.file;
  if (stem.size() > 6 && stem.compare(stem.size() - 6, 6, ".jsonl") == 0) stem.resize(stem.size() - 6);
  res.train_path = o.train_out.empty() ? stem + ".train.jsonl" : o.train_out;
  res.eval_path = o.eval_out.empty() ? stem + ".eval.jsonl" : o.eval_out;
  if (res.train_path == o.file || res.eval_path == o.file || res.train_path == res.eval_path)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[data] the train and eval outputs must be two new files, not the input")
        .with_suggestion("Pass --train-out and --eval-out.");
  std::string train_text, eval_text;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (lines[k].find_first_not_of(" \t\r") == std::string::npos) continue;
    (to_eval[k + 1] ? eval_text : train_text) += lines[k] + "\n";
  }
  res.train_rows = static_cast<int64_t>(ds.total_rows) - res.eval_rows;  // bad rows stay on the train side
  write_file_atomic(res.train_path, train_text);
  write_file_atomic(res.eval_path, eval_text);
  return res;
}

}  // namespace bp
