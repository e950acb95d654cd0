// Random (version 4) UUIDs for run ids (DESIGN.md "Logs"), e.g. "1b4e28ba-2fa1-41d2-883f-0016d3cca427".
#pragma once

#include <string>
#include <string_view>

namespace bp {

// 122 random bits from the OS (std::random_device), version 4, RFC 4122 variant, lower-case hex.
std::string uuid4();
// True for the canonical 8-4-4-4-12 lower/upper-case hex form with version 4 and variant 10xx.
bool is_uuid4(std::string_view s);

}  // namespace bp
