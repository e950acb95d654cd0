// The CUDA entry points explain instead of aborting: in builds without CUDA (the sanitizer build
// is one) every entry point throws RUNTIME_NOT_BUILT_WITH_CUDA; with CUDA but no usable device,
// cuda_status() still returns and says why.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_device.h"
#include "core/error.h"

namespace bp {
namespace {

TEST(CudaEntryPoints, StatusNeverThrowsAndExplains) {
  CudaStatus s = cuda_status();
  if (s.devices.empty()) {
    EXPECT_FALSE(s.why_unavailable.empty());
  }
  if (!s.compiled) {
    EXPECT_NE(s.why_unavailable.find("no CUDA backend"), std::string::npos) << s.why_unavailable;
    EXPECT_TRUE(s.devices.empty());
  }
}

TEST(CudaEntryPoints, UnavailablePathsThrowTheCatalogCode) {
  try {
    cuda_op_unavailable("rms_norm");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA);
    EXPECT_NE(std::string(e.what()).find("[rms_norm]"), std::string::npos) << e.what();
  }
  if (!cuda_status().compiled) {
    try {
      cuda_allocator(0);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA);
      EXPECT_NE(std::string(e.what()).find("not built with CUDA"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace bp
