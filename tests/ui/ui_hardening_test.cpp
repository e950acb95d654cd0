// `backprop ui` against what testing it from outside found (issue #37), at the HTTP level against
// the real executable on 127.0.0.1:
//  * uploads: a full disk (injected ENOSPC) or an existing name never destroys the dataset there;
//    chunked bodies are bounded by --max-upload-mb; curl's default form type is taken or explained;
//  * Host names that merely start with "127." are not loopback (DNS rebinding), nor as --host;
//  * JSON bodies with wrong field types are 400 naming the field, not 500;
//  * Stop signals only the run's own `backprop train`, never another program holding its metrics;
//  * the login limiter counts parallel guesses and locks out one (address, user) pair only;
//  * auth-file iteration counts are bounded; no "Log out" without auth;
//  * event streams are bounded so the API keeps answering.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "ui/ui_test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Names in a folder, hidden ones too (a left-over temporary upload would show).
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

int status_of(const httplib::Result& r) {
  return r ? r->status : -1;
}

class UiHardening : public ::testing::Test {
 protected:
  TempDir tmp;
  std::string runs() const { return tmp.path + "/runs"; }
  std::string data() const { return tmp.path + "/data"; }
  const std::string old_text = "{\"text\": \"the dataset that was there\"}\n";
  void SetUp() override {
    fs::create_directories(fs::path(runs()) / "r1");
    fs::create_directories(data());
    std::ofstream(fs::path(runs()) / "r1" / "metrics.jsonl")
        << "{\"type\":\"step\",\"step\":1,\"loss\":2.5,\"lr\":0.001,\"tokens\":10,\"time\":1.0}\n";
    std::ofstream(fs::path(data()) / "d.jsonl") << old_text;
  }
};

// ---- uploads ------------------------------------------------------------------------------------

TEST_F(UiHardening, AFullDiskKeepsTheDatasetAnUploadWouldReplace) {
  setenv("BACKPROPAGATE_TRAINING__FAULT_INJECT_ENOSPC_AFTER_BYTES", "100", 1);  // the io layer's disk-full hook
  UiProcess ui(runs(), data(), {});
  unsetenv("BACKPROPAGATE_TRAINING__FAULT_INJECT_ENOSPC_AFTER_BYTES");
  ASSERT_TRUE(ui.alive());
  auto c = ui.client();
  const std::string body(10000, 'x');
  auto replace = c.Put("/api/datasets/d.jsonl?overwrite=1", body, "application/octet-stream");
  ASSERT_TRUE(replace);
  EXPECT_EQ(replace->status, 507) << replace->body;
  EXPECT_NE(replace->body.find("STATE_DISK_FULL"), std::string::npos) << replace->body;
  EXPECT_EQ(read_all(fs::path(data()) / "d.jsonl"), old_text);
  auto fresh = c.Put("/api/datasets/new.jsonl", body, "application/octet-stream");
  EXPECT_EQ(status_of(fresh), 507);
  EXPECT_EQ(names_in(data()), std::vector<std::string>{"d.jsonl"});  // no partial file, no temporary
}

TEST_F(UiHardening, AnUploadReplacesAnExistingDatasetOnlyWhenAsked) {
  UiProcess ui(runs(), data(), {});
  auto c = ui.client();
  const std::string body = "{\"text\": \"new\"}\n";
  auto refused = c.Put("/api/datasets/d.jsonl", body, "application/octet-stream");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_NE(refused->body.find("INPUT_VALIDATION_FAILED"), std::string::npos);
  EXPECT_NE(refused->body.find("already exists"), std::string::npos) << refused->body;
  EXPECT_EQ(read_all(fs::path(data()) / "d.jsonl"), old_text);
  auto replaced = c.Put("/api/datasets/d.jsonl?overwrite=1", body, "application/octet-stream");
  ASSERT_EQ(status_of(replaced), 200) << replaced->body;
  EXPECT_EQ(json::parse(replaced->body)["bytes"], body.size());
  EXPECT_EQ(read_all(fs::path(data()) / "d.jsonl"), body);
  EXPECT_EQ(status_of(c.Put("/api/datasets/other.jsonl", body, "application/octet-stream")), 200);
  EXPECT_EQ(names_in(data()), (std::vector<std::string>{"d.jsonl", "other.jsonl"}));
}

// Sends `total` bytes of 'a' chunked (Transfer-Encoding: chunked, no Content-Length).
// Sends `request` (all of it, in one write) from the local address `from` on a raw socket; returns
// the socket and the status of the answer's first line (-1 when none came within 30 s).
std::pair<int, int> send_raw(int port, const char* from, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local);
  sockaddr_in server{};
  server.sin_family = AF_INET;
  server.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &server.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&server), sizeof server) != 0) return {fd, -1};
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) return {fd, -1};
  std::string head;
  char ch;
  while (head.find("\r\n") == std::string::npos && ::recv(fd, &ch, 1, 0) == 1) head.push_back(ch);
  if (head.rfind("HTTP/1.1 ", 0) != 0 || head.size() < 12) return {fd, -1};
  return {fd, std::stoi(head.substr(9, 3))};
}

httplib::Result put_chunked(httplib::Client& c, const std::string& path, size_t total) {
  auto sent = std::make_shared<size_t>(0);
  return c.Put(
      path.c_str(),
      [sent, total](size_t, httplib::DataSink& sink) {
        const std::string piece(std::min<size_t>(64 << 10, total - *sent), 'a');
        if (!piece.empty()) sink.write(piece.data(), piece.size());
        *sent += piece.size();
        if (*sent == total) sink.done();
        return true;
      },
      "application/octet-stream");
}

TEST_F(UiHardening, ChunkedUploadsAreBoundedByTheLimitToo) {
  UiProcess ui(runs(), data(), {"--max-upload-mb", "1"});
  auto c = ui.client();
  auto big = put_chunked(c, "/api/datasets/big.jsonl", (1 << 20) + (64 << 10));
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413) << big->body;
  EXPECT_NE(big->body.find("RUNTIME_UI_UPLOAD_TOO_LARGE"), std::string::npos);
  EXPECT_NE(big->body.find("1048576"), std::string::npos) << big->body;  // the limit, in bytes
  auto small = put_chunked(c, "/api/datasets/small.jsonl", 100000);
  ASSERT_EQ(status_of(small), 200) << small->body;
  EXPECT_EQ(fs::file_size(fs::path(data()) / "small.jsonl"), 100000u);
  EXPECT_EQ(names_in(data()), (std::vector<std::string>{"d.jsonl", "small.jsonl"}));
  // Other routes take no chunked body at all (httplib would hold it in memory, unbounded).
  // The whole request goes in one write: the server answers 411 from the headers and closes, so a
  // client still sending the body could see the connection reset instead of the answer.
  auto [fd, status] = send_raw(ui.port(), "127.0.0.1",
                               "POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(ui.port()) +
                                   "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   "2\r\n{}\r\n0\r\n\r\n");
  ::close(fd);
  EXPECT_EQ(status, 411);
}

TEST_F(UiHardening, CurlsDefaultFormTypeIsTakenForUploadsAndExplainedElsewhere) {
  UiProcess ui(runs(), data(), {});
  auto c = ui.client();
  const std::string body(20000, 'a');  // past httplib's 8 KiB for form bodies
  auto up = c.Put("/api/datasets/form.txt", body, "application/x-www-form-urlencoded");
  ASSERT_EQ(status_of(up), 200) << up->body;
  EXPECT_EQ(read_all(fs::path(data()) / "form.txt"), body);
  auto post = c.Post("/api/estimate", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 415) << post->body;
  EXPECT_NE(post->body.find("x-www-form-urlencoded"), std::string::npos) << post->body;
  EXPECT_EQ(post->body.find("268435456"), std::string::npos) << post->body;  // not "over the 256 MiB limit"
}

// ---- Host, --host ---------------------------------------------------------------------------------

TEST_F(UiHardening, NamesThatStartWith127AreNotLoopback) {
  UiProcess ui(runs(), data(), {});
  auto c = ui.client();
  const std::string port = std::to_string(ui.port());
  for (const std::string host : {"127.attacker.example", "127.0.0.1.attacker.example", "localhost.example"}) {
    auto r = c.Get("/api/runs", {{"Host", host + ":" + port}, {"Origin", "http://" + host + ":" + port}});
    EXPECT_EQ(status_of(r), 403) << host;
  }
  for (const std::string host : {"127.0.0.1", "127.1.2.3", "[::1]", "localhost", "LOCALHOST"})
    EXPECT_EQ(status_of(c.Get("/api/runs", {{"Host", host + ":" + port}})), 200) << host;
  std::string out;
  const int rc = run_command("timeout 20 " + backprop_exe() + " ui --runs " + runs() + " --data-dir " + data() +
                                 " --port " + std::to_string(free_port()) + " --host 127.attacker.example",
                             &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("[RUNTIME_UI_AUTH_NOT_ENFORCED]"), std::string::npos) << out;
}

// ---- request bodies -------------------------------------------------------------------------------

TEST_F(UiHardening, WrongJsonTypesAre400NamingTheField) {
  UiProcess ui(runs(), data(), {});
  auto c = ui.client();
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"/api/runs", {{"model", 5}}, "model"},
      {"/api/runs", {{"model", "m"}, {"dataset", {1, 2}}}, "dataset"},
      {"/api/runs", {{"model", "m"}, {"dataset", "d.jsonl"}, {"settings", {1}}}, "settings"},
      {"/api/runs",
       {{"model", "m"}, {"dataset", "d.jsonl"}, {"settings", {{"training.steps", {{"a", 1}}}}}},
       "settings.training.steps"},
      {"/api/estimate", {{"model", true}}, "model"},
      {"/api/estimate", {{"model", "m"}, {"settings", {{"training.max_memory", 5}}}}, "training.max_memory"},
      {"/api/runs/r1/resume", {{"steps", "ten"}}, "steps"},
      {"/api/runs/r1/export", {{"format", 5}}, "format"},
      {"/api/runs/r1/export", {{"quantization", json::array()}}, "quantization"},
      {"/api/runs/r1/export", {{"ollama", "yes"}}, "ollama"},
  };
  for (const auto& [path, body, name] : cases) {
    SCOPED_TRACE(path + " " + body.dump());
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("INPUT_VALIDATION_FAILED"), std::string::npos) << r->body;
    EXPECT_NE(r->body.find("'" + name), std::string::npos) << r->body;
  }
}

// ---- Stop -----------------------------------------------------------------------------------------

TEST_F(UiHardening, StopNeverSignalsAnotherProgramHoldingTheMetrics) {
  const std::string metrics = runs() + "/r1/metrics.jsonl";
  // A `sleep` that holds the run's metrics.jsonl open, as a `tail -f` would.
  const int fd = ::open(metrics.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::execl("/bin/sleep", "sleep", "120", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fd);
  struct KillOnExit {
    pid_t pid;
    ~KillOnExit() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } guard{holder};
  UiProcess ui(runs(), data(), {});
  auto c = ui.client();
  auto r = c.Post("/api/runs/r1/stop", "", "application/json");
  ASSERT_EQ(status_of(r), 200);
  const json answer = json::parse(r->body);
  EXPECT_EQ(answer["stopped"], false) << r->body;
  EXPECT_NE(answer.value("reason", "").find("no backprop train process"), std::string::npos) << r->body;
  int status = 0;
  EXPECT_EQ(::waitpid(holder, &status, WNOHANG), 0) << "the holder was signalled";
}

// ---- logins ---------------------------------------------------------------------------------------

// An auth file with users alice and bob.
std::string two_user_file(const std::string& dir) {
  const std::string file = dir + "/users";
  for (const char* u : {"alice", "bob"})
    EXPECT_EQ(run_command(std::string("echo pw-") + u + " | " + backprop_exe() + " ui --auth-file " + file +
                              " --set-password " + u,
                          nullptr),
              0);
  return file;
}

TEST_F(UiHardening, ParallelWrongPasswordsCannotPassTheLimit) {
  UiProcess ui(runs(), data(), {"--auth-file", two_user_file(tmp.path), "--max-login-failures", "5"});
  std::atomic<int> refused_401{0}, limited_429{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 40; ++i)
    threads.emplace_back([&] {
      auto c = ui.client();
      c.set_basic_auth("alice", "wrong");
      const int s = status_of(c.Get("/api/runs"));
      (s == 401 ? refused_401 : s == 429 ? limited_429 : other)++;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused_401, 5);  // exactly the limit was checked; every other guess refused unchecked
  EXPECT_EQ(limited_429, 35);
  EXPECT_EQ(other, 0);
  auto c = ui.client();
  c.set_basic_auth("alice", "pw-alice");
  EXPECT_EQ(status_of(c.Get("/api/runs")), 429);  // alice is locked out from this address
}

TEST_F(UiHardening, OneUsersLockoutDoesNotLockOutAnother) {
  UiProcess ui(runs(), data(), {"--auth-file", two_user_file(tmp.path), "--max-login-failures", "2"});
  auto c = ui.client();
  for (const char* user : {"alice", "mallory"}) {  // a real user and a name that does not exist
    c.set_basic_auth(user, "wrong");
    EXPECT_EQ(status_of(c.Get("/api/runs")), 401);
    EXPECT_EQ(status_of(c.Get("/api/runs")), 401);
    EXPECT_EQ(status_of(c.Get("/api/runs")), 429);
  }
  c.set_basic_auth("bob", "pw-bob");  // same address (every loopback client is 127.0.0.1)
  EXPECT_EQ(status_of(c.Get("/api/runs")), 200);
  auto login = c.Post("/login", "user=bob&password=pw-bob", "application/x-www-form-urlencoded");
  EXPECT_EQ(status_of(login), 303);
  EXPECT_EQ(status_of(c.Post("/login", "user=alice&password=pw-alice", "application/x-www-form-urlencoded")), 429);
}

TEST(UiAuthFile, IterationCountsOutsideTheRangeAreRefused) {
  TempDir tmp;
  const std::string salt(32, 'a'), hash(64, 'b');
  for (const std::string iterations : {"2000000000", "999", "5000001"}) {
    SCOPED_TRACE(iterations);
    const std::string file = tmp.path + "/users";
    std::ofstream(file, std::ios::trunc) << "# users\nu:pbkdf2-sha256$" << iterations << "$" << salt << "$" << hash
                                         << "\n";
    ::chmod(file.c_str(), 0600);
    std::string out;
    const int rc = run_command("timeout 20 " + backprop_exe() + " ui --runs " + tmp.path + "/runs --data-dir " +
                                   tmp.path + "/data --port " + std::to_string(free_port()) + " --auth-file " + file,
                               &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("[RUNTIME_UI_AUTH_FILE_INVALID]"), std::string::npos) << out;
    EXPECT_NE(out.find("line 2"), std::string::npos) << out;
    EXPECT_NE(out.find(iterations + " PBKDF2 iterations"), std::string::npos) << out;
  }
}

// ---- the page -------------------------------------------------------------------------------------

TEST_F(UiHardening, NoLogOutWithoutAuth) {
  {
    UiProcess ui(runs(), data(), {});
    auto c = ui.client();
    auto page = c.Get("/");
    ASSERT_EQ(status_of(page), 200);
    EXPECT_EQ(page->body.find("/logout"), std::string::npos);
    EXPECT_EQ(page->body.find("Log out"), std::string::npos);
    EXPECT_EQ(json::parse(c.Get("/api/session")->body)["auth"], false);
  }
  UiProcess ui(runs(), data(), {"--auth", "alice:pw"});
  auto c = ui.client();
  c.set_basic_auth("alice", "pw");
  auto page = c.Get("/");
  ASSERT_EQ(status_of(page), 200);
  EXPECT_NE(page->body.find("action=\"/logout\""), std::string::npos);
  EXPECT_EQ(json::parse(c.Get("/api/session")->body)["auth"], true);
}

// ---- event streams --------------------------------------------------------------------------------

// GET `path` from the local address `from` on a raw socket; returns the socket and the status of the
// answer's first line (-1 when none came within 30 s).
std::pair<int, int> open_stream(int port, const char* from, const std::string& path) {
  return send_raw(
      port, from,
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\nConnection: close\r\n\r\n");
}

TEST_F(UiHardening, OpenEventStreamsAreBoundedAndTheApiKeepsAnswering) {
  UiProcess ui(runs(), data(), {});
  std::map<int, int> statuses;  // HTTP status -> how many
  std::vector<int> fds;
  // 30 run pages from five client addresses (every 127.0.0.0/8 address is this machine's): more
  // than the server's 24 threads.
  for (int i = 0; i < 30; ++i) {
    const std::string from = "127.0.0." + std::to_string(1 + i / 6);
    auto [fd, status] = open_stream(ui.port(), from.c_str(), "/api/runs/r1/events");
    fds.push_back(fd);
    ASSERT_NE(status, -1) << "stream " << i << " got no answer";
    ++statuses[status];
  }
  EXPECT_EQ(statuses[200], 12);  // kMaxStreams: two clients' six each
  EXPECT_EQ(statuses[503], 18);  // the limit overall
  auto [extra, status] = open_stream(ui.port(), "127.0.0.1", "/api/runs/r1/events");
  fds.push_back(extra);
  EXPECT_EQ(status, 429);  // past the limit for this client
  auto c = ui.client();
  c.set_read_timeout(30, 0);
  EXPECT_EQ(status_of(c.Get("/api/runs")), 200);  // with every stream still open
  for (int fd : fds) ::close(fd);
  // A stream opened again from a metrics offset sends only what came after it.
  const std::string from = std::to_string(fs::file_size(runs() + "/r1/metrics.jsonl"));
  std::string events;
  for (int i = 0; i < 300; ++i) {  // until the server has let the closed streams go
    events.clear();
    c.Get(("/api/runs/r1/events?from=" + from).c_str(), [&](const char* d, size_t n) {
      events.append(d, n);
      return events.find("event: status") == std::string::npos;
    });
    if (events.find("event: status") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(events.find("event: status"), std::string::npos);
  EXPECT_EQ(events.find("event: metrics"), std::string::npos) << events.substr(0, 300);
}

// A stream ends after --stream-lifetime-s (60 s by default) and gives its thread back, whether or not
// the page is still there; the page's EventSource then reconnects from the last event id it saw.
TEST_F(UiHardening, EventStreamsEndAfterTheirLifetimeAndFreeTheirSlot) {
  UiProcess ui(runs(), data(), {"--stream-lifetime-s", "2"});
  auto c = ui.client();
  c.set_read_timeout(30, 0);  // a 60 s stream (the flag not applied) fails here
  std::string events;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Get("/api/runs/r1/events", [&](const char* d, size_t n) {
    events.append(d, n);
    return true;  // a page that stays: only the server ends the stream
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(status_of(r), 200) << httplib::to_string(r.error());
  EXPECT_GE(seconds, 1.9);
  EXPECT_LT(seconds, 20.0);
  EXPECT_NE(events.find("event: metrics"), std::string::npos);
  const size_t id_at = events.rfind("\nid: ");
  ASSERT_NE(id_at, std::string::npos) << events.substr(0, 300);
  EXPECT_EQ(std::stoull(events.substr(id_at + 5)), fs::file_size(runs() + "/r1/metrics.jsonl"));
  // Every slot of this client comes back: six pages (the per-client limit) whose streams the server
  // ended, then six more, all served.
  std::atomic<int> ok{0};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> pages;
    for (int i = 0; i < 6; ++i)
      pages.emplace_back([&] {
        auto p = ui.client();
        p.set_read_timeout(30, 0);
        if (status_of(p.Get("/api/runs/r1/events", [](const char*, size_t) { return true; })) == 200) ++ok;
      });
    for (auto& t : pages) t.join();
  }
  EXPECT_EQ(ok.load(), 12) << "streams that ended must free their slots";
}

}  // namespace
}  // namespace bp::test
