// The dashboard's page files (src/ui/assets/*), embedded into the binary at build time by
// CMakeLists.txt (generated/ui_assets.cpp): no CDN, no files to install next to the executable.
#pragma once

#include <span>
#include <string_view>

namespace bp::ui {

struct Asset {
  std::string_view name;  // file name: "app.js"
  std::string_view data;
};
std::span<const Asset> embedded_assets();
// The asset named `name`, or nullptr.
const Asset* find_asset(std::string_view name);
// "text/javascript; charset=utf-8" etc. from the file extension.
const char* content_type_for(std::string_view name);

}  // namespace bp::ui
