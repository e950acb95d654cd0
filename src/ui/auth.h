// Who may use `backprop ui`: credentials (from --auth user:pass or an --auth-file of hashed
// passwords), login sessions (random tokens in an HttpOnly cookie) and the failed-login limiter.
//
// Passwords are never kept in clear when they come from the file: each line is
// `user:pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>` (PBKDF2-HMAC-SHA256 from OpenSSL;
// iterations 1,000..5,000,000, so no line can make a login hang). A
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

// Failed logins per (client address, user name): after `max_failures` failures that pair is locked
// out for five minutes (every attempt refused, right password or not). Keyed by the pair because all
// loopback clients share 127.0.0.1: guesses at one user name, or at a name that does not exist,
// never lock out another user, and a user locked out from one address can still log in from
// another (Grafana and Jupyter limit per user name the same way). begin() counts an attempt in
// flight against the limit, so parallel guesses cannot all pass the check before the first failure
// is recorded: at most max_failures attempts of a pair are ever checked per lockout period.
class LoginLimiter {
 public:
  explicit LoginLimiter(int max_failures) : max_failures_(max_failures) {}
  // Reserves one attempt; false (refuse it) while the pair is locked out or as many attempts as it
  // has left are in flight. Every true must be followed by one finish().
  bool begin(const std::string& address, const std::string& user);
  void finish(const std::string& address, const std::string& user, bool success);

 private:
  struct Entry {
    int failures = 0;
    int in_flight = 0;
    std::chrono::steady_clock::time_point locked_until{};
  };
  void prune(std::chrono::steady_clock::time_point now);  // bounds the table (one entry per guessed name)
  int max_failures_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Entry> entries_;
};

// Base64 decoding for the Authorization: Basic header (empty on malformed input).
std::string base64_decode(const std::string& in);
// Hex of `n` random bytes from OpenSSL's RAND_bytes.
std::string random_hex(int n);

}  // namespace bp::ui
