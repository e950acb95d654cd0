// The -march baseline chosen at configure time (BACKPROP_MARCH, BACKPROP_NATIVE; default x86-64-v2
// on x86-64) reaches the compiler and the flags `backprop info` reports. tests/CMakeLists.txt
// passes the expected value as BP_EXPECTED_MARCH to this file only; the file is compiled with the
// same baseline flags as the library, so the ISA macros it sees are the library's.
#include <string>

#include "build_info.h"
#include "core/sysinfo.h"
#include "support/test_util.h"

namespace bp {

#if defined(__SSE4_2__)
constexpr bool kSse42 = true;
#else
constexpr bool kSse42 = false;
#endif
#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kAvx2Fma = true;
#else
constexpr bool kAvx2Fma = false;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
constexpr bool kAvx512 = true;
#else
constexpr bool kAvx512 = false;
#endif

TEST(BuildBaseline, TheConfiguredMarchReachesTheCompilerAndInfo) {
  const std::string march = BP_EXPECTED_MARCH;
  if (march.empty()) GTEST_SKIP() << "no -march configured (not x86-64)";
  EXPECT_NE(std::string(BP_CXX_FLAGS).find("-march=" + march), std::string::npos) << BP_CXX_FLAGS;
  if (march == "x86-64-v2") {
    EXPECT_TRUE(kSse42);
    EXPECT_FALSE(kAvx2Fma) << "the portable default must not assume AVX2";
  } else if (march == "x86-64-v3") {
    EXPECT_TRUE(kAvx2Fma);
    EXPECT_FALSE(kAvx512);
  } else if (march == "x86-64-v4") {
    EXPECT_TRUE(kAvx2Fma);
    EXPECT_TRUE(kAvx512);
  } else if (march == "native") {
    // Whatever native turned on, this CPU has (the build machine is the test machine).
    const CpuIsa isa = cpu_isa();
    if (kAvx2Fma) {
      EXPECT_TRUE(isa.avx2_fma);
    }
    if (kAvx512) {
      EXPECT_TRUE(isa.avx512);
    }
  }
}

}  // namespace bp
