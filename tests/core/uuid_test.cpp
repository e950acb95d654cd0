#include "core/uuid.h"

#include <gtest/gtest.h>

#include <set>

namespace bp {
namespace {

TEST(Uuid, Version4FormatAndUnique) {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    std::string u = uuid4();
    ASSERT_TRUE(is_uuid4(u)) << u;
    EXPECT_EQ(u[14], '4');
    EXPECT_TRUE(std::string("89ab").find(u[19]) != std::string::npos) << u;
    EXPECT_TRUE(seen.insert(u).second) << "duplicate " << u;
  }
}

TEST(Uuid, ValidatorRejectsOtherForms) {
  EXPECT_TRUE(is_uuid4("1b4e28ba-2fa1-41d2-883f-0016d3cca427"));
  EXPECT_FALSE(is_uuid4("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));  // version 1
  EXPECT_FALSE(is_uuid4("1b4e28ba-2fa1-41d2-c83f-0016d3cca427"));  // wrong variant
  EXPECT_FALSE(is_uuid4("1b4e28ba2fa141d2883f0016d3cca427"));
  EXPECT_FALSE(is_uuid4("1b4e28ba-2fa1-41d2-883f-0016d3cca42g"));
}

}  // namespace
}  // namespace bp
