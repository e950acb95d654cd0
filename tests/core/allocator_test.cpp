#include "core/allocator.h"

#include <sys/resource.h>

#include <cstring>

#include "core/sanitizers.h"
#include "core/tensor.h"
#include "support/test_util.h"

namespace bp {

class AllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_allocator().set_limit(kNoLimit);
    base_ = cpu_allocator().stats().bytes_in_use;
  }
  void TearDown() override {
    cpu_allocator().set_limit(kNoLimit);
    cpu_allocator().fail_after_allocations(0);
  }
  size_t base_ = 0;
};

TEST_F(AllocatorTest, CountsInUseAndPeakExactly) {
  auto& a = cpu_allocator();
  a.reset_peak();
  {
    Tensor x = Tensor::empty({1000}, DType::F32);
    Tensor y = Tensor::empty({3, 7}, DType::BF16);
    EXPECT_EQ(a.stats().bytes_in_use, base_ + 4000 + 42);
  }
  EXPECT_EQ(a.stats().bytes_in_use, base_);
  EXPECT_EQ(a.stats().bytes_peak, base_ + 4042);
  a.reset_peak();
  EXPECT_EQ(a.stats().bytes_peak, base_);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  EXPECT_GT(a.stats().bytes_total, 0u);
}

TEST_F(AllocatorTest, LimitThrowsPyTorchStyleOomWithNumbers) {
  auto& a = cpu_allocator();
  Tensor keep = Tensor::empty({256}, DType::F32);  // 1 KiB in use
  a.set_limit(base_ + 1024 + 2048);
  uint64_t ooms = a.stats().num_ooms;
  try {
    Tensor t = Tensor::empty({1024}, DType::F32);  // 4 KiB > 2 KiB left
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_CPU_OOM) << "host memory: no GPU code";
    EXPECT_EQ(e.bytes_requested(), 4096u);
    EXPECT_EQ(e.bytes_in_use(), base_ + 1024);
    EXPECT_EQ(e.bytes_cached(), 0u);
    EXPECT_EQ(e.bytes_limit(), base_ + 3072);
    std::string m = e.what();
    EXPECT_NE(m.find("Tried to allocate 4.00 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("has a total capacity of"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved but unallocated"), std::string::npos) << m;
    EXPECT_EQ(e.details()["bytes_requested"], 4096u);
  }
  // Consistent after the throw: nothing leaked, the next fitting allocation works.
  EXPECT_EQ(a.stats().bytes_in_use, base_ + 1024);
  EXPECT_EQ(a.stats().num_ooms, ooms + 1);
  Tensor fits = Tensor::empty({512}, DType::F32);
  EXPECT_EQ(a.stats().bytes_in_use, base_ + 3072);
}

TEST_F(AllocatorTest, InjectedFailureHitsTheChosenAllocationOnce) {
  auto& a = cpu_allocator();
  a.fail_after_allocations(3);
  Tensor t1 = Tensor::empty({4});
  Tensor t2 = Tensor::empty({4});
  EXPECT_THROW(Tensor::empty({4}), OutOfMemoryError);
  Tensor t4 = Tensor::empty({4});  // disarmed after firing
  EXPECT_EQ(a.stats().bytes_in_use, base_ + 48);
}

long minor_faults_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// A training step allocates, fills and frees the same MiB-sized blocks every step; the allocator
// keeps freed memory for reuse, so the repeats page-fault nothing (glibc's defaults unmap such
// blocks or trim them from the heap, and each repeat faulted all 4,096 pages in again).
TEST_F(AllocatorTest, RepeatedLargeAllocationsReuseMemoryWithoutPageFaults) {
#if BP_ASAN
  GTEST_SKIP() << "AddressSanitizer's malloc quarantines freed blocks and ignores mallopt: glibc's reuse is not "
                  "what runs here";
#endif
  constexpr int64_t kFloats = int64_t(4) << 20;  // 16 MiB: 4,096 pages
  long faults_in_repeats = 0;
  for (int round = 0; round < 4; ++round) {
    const long before = minor_faults_now();
    {
      Tensor t = Tensor::empty({kFloats}, DType::F32);
      std::memset(t.data<float>(), round + 1, static_cast<size_t>(kFloats) * sizeof(float));
      Tensor small = Tensor::empty({1000}, DType::F32);  // something else on the heap between rounds
      small.data<float>()[0] = 1.0f;
    }
    if (round >= 1) faults_in_repeats += minor_faults_now() - before;
  }
  EXPECT_LT(faults_in_repeats, 3 * 4096 / 8) << "freed blocks were given back and faulted in again";
}

TEST(FormatBytes, PyTorchUnits) {
  EXPECT_EQ(format_bytes(17), "17 bytes");
  EXPECT_EQ(format_bytes(2048), "2.00 KiB");
  EXPECT_EQ(format_bytes(size_t(2) << 30), "2.00 GiB");
}

}  // namespace bp
