// Dataset uploads of `backprop ui` (dataset_upload.h says what is guaranteed).
#include "ui/dataset_upload.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "io/atomic_file.h"
#include "ui/api.h"
#include "ui/auth.h"
#include "ui/runs.h"

namespace bp::ui {

namespace fs = std::filesystem;

namespace {

// A refused body is still read (and dropped) up to this much past the limit, so that a client that
// overshoots gets the answer rather than a reset connection; beyond it the connection is cut.
constexpr size_t kDrainBytes = 16u << 20;

void send_too_large(httplib::Response& res, const httplib::Request& req, size_t received, size_t limit) {
  const std::string length = req.get_header_value("Content-Length");
  const std::string size =
      length.empty() ? fmt::format("at least {} bytes (sent chunked)", received) : length + " bytes";
  send_error(
      res, 413, ErrorCode::RUNTIME_UI_UPLOAD_TOO_LARGE,
      fmt::format("[ui] the upload is {}, over the limit of {} bytes (--max-upload-mb {})", size, limit, limit >> 20));
}

// Moves the finished upload onto `dest`: replaces it only when `overwrite`, else fails with EEXIST
// when `dest` exists (even one created since the first check). Returns 0 or an errno.
int move_into_place(const fs::path& staged, const fs::path& dest, bool overwrite) {
  if (overwrite) return ::rename(staged.c_str(), dest.c_str()) == 0 ? 0 : errno;
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  // A file system without RENAME_NOREPLACE: link() refuses an existing name just the same.
  if (::link(staged.c_str(), dest.c_str()) != 0) return errno;
  ::unlink(staged.c_str());
  return 0;
}

}  // namespace

void upload_dataset(const fs::path& data_dir, size_t max_upload_bytes, const httplib::Request& req,
                    httplib::Response& res, const httplib::ContentReader& content_reader) {
  size_t received = 0;
  // A refusal still reads the body (up to the limit and a bit), so the client gets the answer
  // rather than a reset connection while it is still sending, and the connection stays usable.
  const auto drain = [&] {
    if (!req.is_multipart_form_data())
      content_reader([&](const char*, size_t n) { return (received += n) <= max_upload_bytes + kDrainBytes; });
  };
  fs::path dest;
  try {
    dest = resolve_inside(data_dir, req.matches[1]);
    const std::string ext = dest.extension().string();
    if (ext != ".jsonl" && ext != ".json" && ext != ".txt")
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] datasets are .jsonl, .json or .txt files");
    if (req.is_multipart_form_data())
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  "[ui] send the dataset file itself as the request body (curl -T FILE URL), not as a multipart form");
  } catch (const Error&) {
    drain();
    throw;
  }
  const std::string overwrite_param = req.get_param_value("overwrite");
  const bool overwrite = overwrite_param == "1" || overwrite_param == "true";
  const std::string name = dest.filename().string();
  const auto exists = [&] {
    return send_error(res, 409, ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[ui] a dataset named {} already exists; pick another name or ask to replace it "
                                  "(?overwrite=1); nothing was changed",
                                  name));
  };
  if (!overwrite && fs::exists(dest)) {
    drain();
    return exists();
  }

  const fs::path staged = data_dir / fmt::format(".{}.upload-{}", name, random_hex(6));
  std::optional<Error> write_error;
  bool too_large = false;
  {
    AtomicFile file(staged.string());  // writes <staged>.tmp, removes it unless committed
    const bool complete = content_reader([&](const char* data, size_t n) {
      received += n;
      if (received > max_upload_bytes) too_large = true;
      if (too_large || write_error) return received <= max_upload_bytes + kDrainBytes;  // dropped
      try {
        file.write(data, n);
      } catch (const Error& e) {
        write_error = e;
      }
      return true;
    });
    if (write_error) {
      Error e = *write_error;
      if (e.code() == ErrorCode::STATE_DISK_FULL)
        e = std::move(Error(ErrorCode::STATE_DISK_FULL,
                            fmt::format("[ui] no space left in {} after writing {} of the {} bytes of {}; nothing "
                                        "was changed",
                                        data_dir.string(), file.bytes_written(), received, name))
                          .with_suggestion("Free disk space in the dataset folder and upload again; a dataset of that "
                                           "name that existed before is unchanged."));
      throw e;
    }
    if (too_large || res.status == 413) return send_too_large(res, req, received, max_upload_bytes);
    if (!complete)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[ui] the upload of {} ended after {} bytes, before its end; nothing was changed", name,
                              received));
    file.commit();  // fsync, rename to the hidden staged name, fsync of the folder
  }
  const int err = move_into_place(staged, dest, overwrite);
  if (err != 0) {
    ::unlink(staged.c_str());
    if (err == EEXIST) return exists();
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[ui] cannot move the upload onto {}: {}", dest.string(), std::strerror(err)));
  }
  fsync_dir(data_dir.string());
  res.status = 200;
  res.set_content(nlohmann::json{{"name", name}, {"bytes", received}}.dump(), "application/json");
}

}  // namespace bp::ui
