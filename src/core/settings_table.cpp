// The settings table as data: the rows of settings_registry.inc (the one place a setting is
// declared) expanded into SettingSpec, and the order of the sections.
#include "core/settings.h"

namespace bp {

namespace {
using namespace setting_rows;

constexpr SettingSpec kSettings[] = {
#include "core/settings_registry.inc"
};

constexpr const char* kSections[] = {"model",    "lora", "training", "data",    "export", "generate", "monitor",
                                     "multirun", "ui",   "security", "runtime", "limits", "logging"};
}  // namespace

std::span<const SettingSpec> settings_registry() {
  return kSettings;
}
std::span<const char* const> setting_sections() {
  return kSections;
}

}  // namespace bp
