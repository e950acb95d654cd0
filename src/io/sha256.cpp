#include "io/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "core/error.h"

namespace bp {

namespace {
struct Hasher {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
  Hasher() { BP_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "[sha256] init failed"); }
  void update(const void* p, size_t n) { EVP_DigestUpdate(ctx.get(), p, n); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    static const char* kHex = "0123456789abcdef";
    std::string s(len * 2, '0');
    for (unsigned i = 0; i < len; ++i) {
      s[2 * i] = kHex[md[i] >> 4];
      s[2 * i + 1] = kHex[md[i] & 15];
    }
    return s;
  }
};
}  // namespace

std::string sha256_hex(std::string_view data) {
  Hasher h;
  h.update(data.data(), data.size());
  return h.hex();
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[sha256] cannot read {}: {}", path, std::strerror(errno)), {{"path", path}});
  Hasher h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex();
}

}  // namespace bp
