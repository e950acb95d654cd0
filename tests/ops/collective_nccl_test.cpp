// NCCL behind the collective interface (ops/collective_nccl.h, core/nccl.h), as far as a machine
// without a GPU can check it: the library is loaded at run time (never linked), so a missing one is
// a catalog error naming every place looked at, and the default search says what it found. The
// reductions themselves need two GPUs: scripts/gpu_check.sh's 2-GPU stage runs them.
#include "ops/collective_nccl.h"

#include <gtest/gtest.h>

#include <string>

#include "core/collective.h"
#include "core/error.h"
#include "core/nccl.h"

namespace bp {
namespace {

TEST(Nccl, MissingLibraryIsNotAvailableAndSaysWhere) {
  const NcclAvailability a = nccl_availability("/nonexistent/libnccl.so.2");
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.why.find("/nonexistent/libnccl.so.2: not found"), std::string::npos) << a.why;
  std::string why;
  EXPECT_EQ(load_nccl("/nonexistent/libnccl.so.2", &why), nullptr);
  EXPECT_FALSE(why.empty());
}

// A library that is there but is not NCCL (libm): refused, naming the missing symbols.
TEST(Nccl, ALibraryWithoutNcclSymbolsIsRefused) {
  std::string why;
  EXPECT_EQ(load_nccl("libm.so.6", &why), nullptr);
  EXPECT_NE(why.find("not an NCCL of version 2.7 or later"), std::string::npos) << why;
  EXPECT_NE(why.find("ncclSend"), std::string::npos) << why;
}

// The default search: NCCL found (with a version) or every place tried named, the CUDA toolkit's
// among them.
TEST(Nccl, DefaultSearchFindsItOrNamesThePlacesTried) {
  const NcclAvailability a = nccl_availability();
  if (a.available) {
    EXPECT_FALSE(a.path.empty());
    EXPECT_NE(a.version, "unknown");
  } else {
    EXPECT_NE(a.why.find("libnccl.so.2"), std::string::npos) << a.why;
    EXPECT_NE(a.why.find("/usr/local/cuda/lib64/libnccl.so.2"), std::string::npos) << a.why;
  }
}

// The collective for a CUDA run asked for a library that is not there: DEP_DISTRIBUTED_UNAVAILABLE
// with the path and the ways out, before any communication.
TEST(Nccl, CollectiveOverAMissingLibraryIsACatalogError) {
  auto host = make_single_collective();
  try {
    make_nccl_collective(*host, Device{DeviceType::CUDA, 0}, "/nonexistent/libnccl.so.2");
    FAIL() << "a missing NCCL made a collective";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libnccl.so.2"), std::string::npos) << e.what();
    EXPECT_NE(e.suggestion().find("training.nccl_library none"), std::string::npos) << e.suggestion();
  }
}

TEST(Nccl, VersionText) {
  EXPECT_EQ(nccl_version_text(22304), "2.23.4");
  EXPECT_EQ(nccl_version_text(2708), "2.7.8");
  EXPECT_EQ(nccl_version_text(0), "unknown");
}

}  // namespace
}  // namespace bp
