// Look-up of the embedded page files (assets.h; the table is generated/ui_assets.cpp).
#include "ui/assets.h"

namespace bp::ui {

const Asset* find_asset(std::string_view name) {
  for (const auto& a : embedded_assets())
    if (a.name == name) return &a;
  return nullptr;
}

const char* content_type_for(std::string_view name) {
  auto ends = [&](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace bp::ui
