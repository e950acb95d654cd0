// Command-line flags from the settings table (cli/setting_flags.h): names, types and help from the
// row; flags override every other layer; auto|true|false settings take every boolean form; a
// testing setting's flag is parsed but hidden from --help. (Moved from tests/core when the CLI11
// binding left core/.)
#include "cli/setting_flags.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>

#include "core/error.h"
#include "support/expect_error.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::expect_error;

TEST(SettingFlags, FlagsComeFromTheTableAndOverrideEverything) {
  CLI::App app;
  std::vector<SettingOverride> flags;
  bind_setting_flags(app, flags, {"training.lr", "training.gradient_checkpointing", "lora.r", "data.strict"});
  std::vector<std::string> args = {"--no-gradient-checkpointing", "--strict", "--lora-r", "4", "--lr", "0.01"};
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector in reverse order
  app.parse(args);
  Settings s = Settings::load("", {{"BACKPROPAGATE_TRAINING__LR", "0.5"}, {"BACKPROPAGATE_LORA__R", "32"}}, flags);
  EXPECT_DOUBLE_EQ(s.get_float("training.lr"), 0.01);
  EXPECT_EQ(s.get_string("training.gradient_checkpointing"), "false");
  EXPECT_TRUE(s.get_bool("data.strict"));
  EXPECT_EQ(s.get_int("lora.r"), 4);
  EXPECT_EQ(s.source("lora.r"), SettingSource::Flag);

  CLI::App app2;
  std::vector<SettingOverride> flags2;
  bind_setting_flags(app2, flags2, {"training.oom_recovery", "training.lr"});
  app2.parse("--oom-recovery=false --lr abc", false);
  expect_error([&] { Settings::load("", {}, flags2); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"training.lr", "abc", "--lr"});
  flags2.erase(flags2.begin() + 1);
  EXPECT_FALSE(Settings::load("", {}, flags2).get_bool("training.oom_recovery"));

  CLI::App app3;
  std::vector<SettingOverride> flags3;
  expect_error([&] { bind_setting_flags(app3, flags3, {"training.nope"}); }, ErrorCode::RUNTIME_INTERNAL,
               {"training.nope"});
}

// training.gradient_checkpointing is auto|true|false: default auto; flags --x, --x=VALUE, --no-x;
// environment and TOML take the boolean spellings too; anything else fails with the setting named.
TEST(SettingFlags, AutoBooleanTakesEveryForm) {
  const std::string key = "training.gradient_checkpointing";
  EXPECT_EQ(Settings::load("", {}, {}).get_string(key), "auto");
  auto from_flags = [&](const std::string& line) {
    CLI::App app;
    std::vector<SettingOverride> flags;
    bind_setting_flags(app, flags, {"training.gradient_checkpointing", "training.lr"});
    app.parse(line, false);
    return Settings::load("", {}, flags).get_string(key);
  };
  EXPECT_EQ(from_flags("--gradient-checkpointing"), "true");
  EXPECT_EQ(from_flags("--gradient-checkpointing --lr 0.1"), "true");
  EXPECT_EQ(from_flags("--gradient-checkpointing=auto"), "auto");
  EXPECT_EQ(from_flags("--gradient-checkpointing false"), "false");
  EXPECT_EQ(from_flags("--no-gradient-checkpointing"), "false");
  EXPECT_EQ(Settings::load("", {{"BACKPROPAGATE_TRAINING__GRADIENT_CHECKPOINTING", "no"}}, {}).get_string(key),
            "false");
  EXPECT_EQ(Settings::load("", {{"BACKPROPAGATE_TRAINING__GRADIENT_CHECKPOINTING", "1"}}, {}).get_string(key), "true");
  Settings t = Settings::load("", {}, {});
  t.apply_toml_string("[training]\ngradient_checkpointing = false\n", "test.toml");
  EXPECT_EQ(t.get_string(key), "false");
  expect_error([&] { from_flags("--gradient-checkpointing=sometimes"); }, ErrorCode::CONFIG_INVALID_SETTING,
               {key, "sometimes"});
}

TEST(SettingFlags, TestingSettingsHaveHiddenFlagsThatStillParse) {
  CLI::App app;
  std::vector<SettingOverride> flags;
  bind_setting_flags(app, flags, {"training.fault_inject_nan_step", "training.lr"});
  const std::string help = app.help();
  EXPECT_NE(help.find("--lr"), std::string::npos) << help;
  EXPECT_EQ(help.find("--fault-inject-nan-step"), std::string::npos) << help;
  app.parse("--fault-inject-nan-step 3", false);
  EXPECT_EQ(Settings::load("", {}, flags).get_int("training.fault_inject_nan_step"), 3);
}

}  // namespace
}  // namespace bp
