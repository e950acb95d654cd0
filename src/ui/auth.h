// Who may use `backprop ui`: credentials (from --auth user:pass or an --auth-file of hashed
// passwords), login sessions (random tokens in an HttpOnly cookie) and the failed-login limiter.
//
// Passwords are never kept in clear when they come from the file: each line is
// `user:pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>` (PBKDF2-HMAC-SHA256 from OpenSSL). A
// password given with --auth is hashed the same way at start-up, so every check is the same
// PBKDF2 + constant-time comparison (CRYPTO_memcmp) whatever the source. Unknown users are checked
// against a dummy hash so the time taken does not reveal which user names exist.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bp::ui {

struct PasswordHash {
  int iterations = 0;
  std::string salt;  // raw bytes
  std::string hash;  // raw bytes (32)
};

// A new PBKDF2-HMAC-SHA256 hash of `password` with a random 16-byte salt.
PasswordHash hash_password(const std::string& password, int iterations = 200000);
// "pbkdf2-sha256$iter$salthex$hashhex"; parse throws RUNTIME_UI_AUTH_FILE_INVALID naming `where`.
std::string format_hash(const PasswordHash& h);
PasswordHash parse_hash(const std::string& text, const std::string& where);
// Constant-time check of `password` against `h`.
bool verify_password(const std::string& password, const PasswordHash& h);

class Credentials {
 public:
  bool enabled() const { return !users_.empty(); }
  // "user:pass" from --auth (hashed here, the clear text is not kept).
  static Credentials from_user_pass(const std::string& user_pass);
  // The auth file: one user:hash per line, '#' comments; throws RUNTIME_UI_AUTH_FILE_INVALID when it
  // is missing, unreadable, readable or writable by group/others, empty or malformed.
  static Credentials from_file(const std::string& path);
  // True when user and password match (constant time in the password, same work for unknown users).
  bool check(const std::string& user, const std::string& password) const;

 private:
  std::map<std::string, PasswordHash> users_;
};

// Adds or replaces `user` in the auth file with a hash of `password` (file mode 0600).
void set_password_in_file(const std::string& path, const std::string& user, const std::string& password);

// Logged-in sessions: token -> user, expiring after 12 hours.
class Sessions {
 public:
  std::string create(const std::string& user);
  bool valid(const std::string& token);
  void remove(const std::string& token);

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> tokens_;
};

// Failed logins per client address: after `max_failures` failures the address is locked out for
// five minutes (every attempt refused, right password or not). A success clears the count.
class LoginLimiter {
 public:
  explicit LoginLimiter(int max_failures) : max_failures_(max_failures) {}
  bool locked(const std::string& address);
  void failed(const std::string& address);
  void succeeded(const std::string& address);

 private:
  struct Entry {
    int failures = 0;
    std::chrono::steady_clock::time_point locked_until{};
  };
  int max_failures_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// Base64 decoding for the Authorization: Basic header (empty on malformed input).
std::string base64_decode(const std::string& in);
// Hex of `n` random bytes from OpenSSL's RAND_bytes.
std::string random_hex(int n);

}  // namespace bp::ui
