#include "core/uuid.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <random>

namespace bp {

std::string uuid4() {
  std::random_device rd;  // /dev/urandom on Linux
  std::array<uint8_t, 16> b;
  for (size_t i = 0; i < b.size(); i += 4) {
    uint32_t r = rd();
    for (int k = 0; k < 4; ++k) b[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // variant 10xx
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}

bool is_uuid4(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (s[i] == '-')) return false;
    if (!dash && !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  char variant = static_cast<char>(std::tolower(static_cast<unsigned char>(s[19])));
  return s[14] == '4' && (variant == '8' || variant == '9' || variant == 'a' || variant == 'b');
}

}  // namespace bp
