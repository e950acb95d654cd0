// The export format table (export/exporter.h) against the export.format setting: a format in one
// list but not the other would be a --format value that is refused, or one that does nothing.
#include "export/exporter.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/settings.h"

namespace bp {
namespace {

TEST(ExportFormats, TableMatchesTheFormatSetting) {
  const SettingSpec* spec = find_setting("export.format");
  ASSERT_NE(spec, nullptr);
  std::string names;
  for (const ExportFormat& f : export_formats()) {
    names += (names.empty() ? "" : "|") + std::string(f.name);
    EXPECT_NE(f.write, nullptr) << f.name;
    EXPECT_NE(std::string(f.description), "") << f.name;
  }
  EXPECT_EQ(names, std::string(spec->choices));
}

TEST(ExportFormats, UnknownFormatListsTheTable) {
  ExportRequest rq;
  rq.format = "onnx";
  rq.input = "anything";
  try {
    run_export(rq);
    FAIL() << "an unknown format was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("lora, merged, gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp
