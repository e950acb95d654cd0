#include "train/oom_recovery.h"

#include <new>

#include "core/tensor.h"
#include "support/test_util.h"

namespace bp {

// A fake micro-batch runner: runs out of memory whenever a micro-batch holds more than
// `fits` sequences, by really allocating past the CPU allocator's limit.
struct FakeStep {
  int64_t fits;
  std::vector<int64_t> seen;  // sequences whose gradients were accumulated (after resets)
  std::vector<int64_t> pending;
  void run(int64_t b, int64_t e) {
    auto& a = cpu_allocator();
    size_t base = a.stats().bytes_in_use;
    a.set_limit(base + static_cast<size_t>(fits) * 1024);
    struct Restore {
      ~Restore() { cpu_allocator().set_limit(kNoLimit); }
    } restore;
    Tensor act = Tensor::empty({(e - b) * 256});  // 1 KiB per sequence
    for (int64_t i = b; i < e; ++i) pending.push_back(i);
  }
  void reset() { pending.clear(); }
};

TEST(OomRecovery, HalvesMicroBatchKeepsEffectiveBatchAndSameSamples) {
  FakeStep s{3, {}, {}};
  OomRecovery r(16, 16, true, cpu_allocator());
  std::vector<OomEvent> events;
  r.run_step(
      16, [&](int64_t b, int64_t e) { s.run(b, e); }, [&] { s.reset(); },
      [&](const OomEvent& ev) { events.push_back(ev); });
  EXPECT_EQ(r.micro_seqs(), 2);  // 16 -> 8 -> 4 -> 2
  EXPECT_EQ(r.accumulation(), 8);
  EXPECT_EQ(r.recoveries(), 3);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].micro_seqs_before, 16);
  EXPECT_EQ(events[0].micro_seqs_after, 8);
  EXPECT_EQ(events[0].kind, OomKind::OutOfMemory);
  EXPECT_GT(events[0].memory.bytes_limit, 0u);
  // Every sample exactly once, in order: nothing lost, nothing repeated.
  std::vector<int64_t> expect(16);
  for (int i = 0; i < 16; ++i) expect[static_cast<size_t>(i)] = i;
  EXPECT_EQ(s.pending, expect);
  // The next step starts at the recovered size and needs no recovery.
  s.reset();
  r.run_step(
      16, [&](int64_t b, int64_t e) { s.run(b, e); }, [&] { s.reset(); }, {});
  EXPECT_EQ(r.recoveries(), 3);
}

TEST(OomRecovery, ExhaustedAfterThreeFailuresAtOneSequence) {
  FakeStep s{0, {}, {}};  // nothing fits
  OomRecovery r(4, 2, true, cpu_allocator());
  int events = 0;
  try {
    r.run_step(
        4, [&](int64_t b, int64_t e) { s.run(b, e); }, [&] { s.reset(); }, [&](const OomEvent&) { ++events; });
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_OOM_RECOVERY_EXHAUSTED) << e.what();
    EXPECT_EQ(e.details()["micro_batch_seqs"], 1);
  }
  EXPECT_EQ(events, 3);  // 2->1, then two more at 1; the third failure at 1 is fatal
}

TEST(OomRecovery, DisabledMakesFirstOomFatalWithSnapshot) {
  FakeStep s{1, {}, {}};
  OomRecovery r(4, 4, false, cpu_allocator());
  try {
    r.run_step(
        4, [&](int64_t b, int64_t e) { s.run(b, e); }, [&] { s.reset(); }, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_CPU_OOM) << "the CPU allocator ran out: no GPU code";
    EXPECT_NE(std::string(e.what()).find("--no-oom-recovery"), std::string::npos);
    EXPECT_TRUE(e.details().contains("bytes_in_use"));
  }
}

TEST(OomRecovery, AdjacentErrorsTakeTheSamePath) {
  EXPECT_EQ(classify_oom(std::bad_alloc()), OomKind::Adjacent);
  EXPECT_EQ(classify_oom(std::runtime_error("cuBLAS error: CUBLAS_STATUS_ALLOC_FAILED")), OomKind::Adjacent);
  EXPECT_EQ(classify_oom(std::runtime_error("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED")), OomKind::Adjacent);
  EXPECT_EQ(classify_oom(std::runtime_error("CUDA error: out of memory")), OomKind::Adjacent);
  EXPECT_EQ(classify_oom(std::runtime_error("shape mismatch")), OomKind::None);
  int calls = 0;
  OomRecovery r(2, 2, true, cpu_allocator());
  std::vector<OomEvent> evs;
  r.run_step(
      2,
      [&](int64_t b, int64_t e) {
        if (++calls == 1) throw std::bad_alloc();
      },
      [] {}, [&](const OomEvent& ev) { evs.push_back(ev); });
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].kind, OomKind::Adjacent);
  EXPECT_EQ(r.micro_seqs(), 1);
  // Other errors pass through untouched.
  EXPECT_THROW(r.run_step(
                   2, [&](int64_t, int64_t) { throw Error(ErrorCode::RUNTIME_INTERNAL, "x"); }, [] {}, {}),
               Error);
}

}  // namespace bp
