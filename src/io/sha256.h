// SHA-256 of files and buffers (OpenSSL's EVP), hex-encoded. Used by checkpoint manifests and
// Ollama blob digests.
#pragma once

#include <string>
#include <string_view>

namespace bp {

std::string sha256_hex(std::string_view data);
// Streams the file; throws INPUT_VALIDATION_FAILED when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace bp
