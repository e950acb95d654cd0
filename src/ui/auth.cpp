// Credentials, sessions and the login limiter of `backprop ui` (see auth.h for the file format).
#include "ui/auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace bp::ui {

namespace {

constexpr auto kSessionLifetime = std::chrono::hours(12);
constexpr auto kLockout = std::chrono::minutes(5);
// Past this many (address, user) pairs the limiter forgets those that are not locked out.
constexpr size_t kMaxLimiterEntries = 10000;
// A password given on the command line lives only in memory: online guessing is what the limiter
// stops, so fewer iterations keep each request with basic auth cheap. Files use the full count.
constexpr int kMemoryIterations = 20000;
// Iteration counts an auth file may name: at least a token cost, at most ~a few seconds per login.
constexpr int kMinIterations = 1000;
constexpr int kMaxIterations = 5000000;

std::string to_hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool from_hex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0 || hex.empty()) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      char c = hex[i + k];
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    out->push_back(static_cast<char>(v));
  }
  return true;
}

std::string pbkdf2(const std::string& password, const std::string& salt, int iterations) {
  std::string out(32, '\0');
  PKCS5_PBKDF2_HMAC(password.data(), static_cast<int>(password.size()),
                    reinterpret_cast<const unsigned char*>(salt.data()), static_cast<int>(salt.size()), iterations,
                    EVP_sha256(), 32, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

Error file_error(const std::string& msg) {
  return Error(ErrorCode::RUNTIME_UI_AUTH_FILE_INVALID, "[ui] " + msg);
}

}  // namespace

std::string random_hex(int n) {
  std::string bytes(static_cast<size_t>(n), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), n) != 1)
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[ui] RAND_bytes failed");
  return to_hex(bytes);
}

PasswordHash hash_password(const std::string& password, int iterations) {
  PasswordHash h;
  h.iterations = iterations;
  from_hex(random_hex(16), &h.salt);
  h.hash = pbkdf2(password, h.salt, iterations);
  return h;
}

std::string format_hash(const PasswordHash& h) {
  return fmt::format("pbkdf2-sha256${}${}${}", h.iterations, to_hex(h.salt), to_hex(h.hash));
}

PasswordHash parse_hash(const std::string& text, const std::string& where) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string p;
  while (std::getline(ss, p, '$')) parts.push_back(p);
  PasswordHash h;
  if (parts.size() != 4 || parts[0] != "pbkdf2-sha256")
    throw file_error(fmt::format("{}: expected user:pbkdf2-sha256$ITERATIONS$SALT$HASH", where));
  try {
    h.iterations = std::stoi(parts[1]);
  } catch (const std::exception&) {
    h.iterations = 0;
  }
  // Each login costs `iterations` HMACs: a huge count (2e9) would hang every login for minutes.
  if (h.iterations < kMinIterations || h.iterations > kMaxIterations)
    throw file_error(
        fmt::format("{}: {} PBKDF2 iterations, outside {}..{}; store the password again with "
                    "--set-password",
                    where, parts[1], kMinIterations, kMaxIterations));
  if (!from_hex(parts[2], &h.salt) || !from_hex(parts[3], &h.hash) || h.hash.size() != 32)
    throw file_error(fmt::format("{}: bad salt or hash (hex; the hash has 32 bytes)", where));
  return h;
}

bool verify_password(const std::string& password, const PasswordHash& h) {
  const std::string got = pbkdf2(password, h.salt, h.iterations);
  return got.size() == h.hash.size() && CRYPTO_memcmp(got.data(), h.hash.data(), got.size()) == 0;
}

Credentials Credentials::from_user_pass(const std::string& user_pass) {
  Credentials c;
  const auto colon = user_pass.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == user_pass.size())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING, "[ui] --auth must be user:password (both non-empty)");
  c.users_[user_pass.substr(0, colon)] = hash_password(user_pass.substr(colon + 1), kMemoryIterations);
  return c;
}

Credentials Credentials::from_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw file_error(fmt::format("--auth-file {} does not exist", path));
  if ((st.st_mode & 077) != 0)
    throw file_error(fmt::format("--auth-file {} has mode {:o}: other users can read or change it (chmod 600 {})", path,
                                 st.st_mode & 0777, path));
  std::ifstream in(path);
  if (!in) throw file_error(fmt::format("--auth-file {} cannot be read", path));
  Credentials c;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    const std::string where = fmt::format("{} line {}", path, n);
    if (colon == std::string::npos || colon == 0) throw file_error(where + ": expected user:hash");
    c.users_[line.substr(0, colon)] = parse_hash(line.substr(colon + 1), where);
  }
  if (c.users_.empty()) throw file_error(fmt::format("--auth-file {} names no user", path));
  return c;
}

bool Credentials::check(const std::string& user, const std::string& password) const {
  if (users_.empty()) return false;
  // An unknown user costs the same PBKDF2 work as a known one (checked against the first user's
  // hash, then refused), so response times do not tell which user names exist.
  auto it = users_.find(user);
  const bool found = it != users_.end();
  const bool ok = verify_password(password, found ? it->second : users_.begin()->second);
  return ok && found;
}

void set_password_in_file(const std::string& path, const std::string& user, const std::string& password) {
  if (user.empty() || user.find(':') != std::string::npos || password.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] --set-password needs a user name without ':' and a password");
  std::vector<std::string> lines;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(user + ":", 0) != 0) lines.push_back(line);
  }
  lines.push_back(user + ":" + format_hash(hash_password(password)));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    ::chmod(tmp.c_str(), 0600);
    for (const auto& l : lines) out << l << "\n";
    if (!out) throw file_error(fmt::format("cannot write {}", tmp));
  }
  std::filesystem::rename(tmp, path);
}

std::string Sessions::create(const std::string& user) {
  std::string token = random_hex(32);
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[token] = {user, std::chrono::steady_clock::now() + kSessionLifetime};
  return token;
}

bool Sessions::valid(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end()) return false;
  if (std::chrono::steady_clock::now() > it->second.second) {
    tokens_.erase(it);
    return false;
  }
  return true;
}

void Sessions::remove(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_.erase(token);
}

bool LoginLimiter::begin(const std::string& address, const std::string& user) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (entries_.size() > kMaxLimiterEntries) prune(now);
  Entry& e = entries_[{address, user}];
  if (e.failures >= max_failures_ && now >= e.locked_until) e.failures = 0;  // the lockout is over
  if (e.failures + e.in_flight >= max_failures_) return false;
  ++e.in_flight;
  return true;
}

void LoginLimiter::finish(const std::string& address, const std::string& user, bool success) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[{address, user}];
  if (e.in_flight > 0) --e.in_flight;
  if (success) {
    e.failures = 0;
  } else if (++e.failures >= max_failures_) {
    e.locked_until = std::chrono::steady_clock::now() + kLockout;
  }
  if (e.failures == 0 && e.in_flight == 0) entries_.erase({address, user});
}

void LoginLimiter::prune(std::chrono::steady_clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = it->second;
    const bool locked = e.failures >= max_failures_ && now < e.locked_until;
    it = (e.in_flight == 0 && !locked) ? entries_.erase(it) : std::next(it);
  }
}

std::string base64_decode(const std::string& in) {
  std::string out;
  int val = 0, bits = -8;
  for (unsigned char c : in) {
    int d;
    if (c >= 'A' && c <= 'Z')
      d = c - 'A';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      d = c - '0' + 52;
    else if (c == '+')
      d = 62;
    else if (c == '/')
      d = 63;
    else if (c == '=')
      break;
    else
      return {};
    val = (val << 6) + d;
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

}  // namespace bp::ui
