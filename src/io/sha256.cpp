#include "io/sha256.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/file_read.h"

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
  // A regular file only: a FIFO or a device planted in a checkpoint folder must not block or run forever.
  const OpenFile file = open_regular_file(path, {"sha256", ErrorCode::INPUT_VALIDATION_FAILED});
  Hasher h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(file.fd(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[sha256] cannot read {}: {}", path, std::strerror(errno)), {{"path", path}});
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
  }
  return h.hex();
}

}  // namespace bp
