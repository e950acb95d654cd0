// `PUT /api/datasets/NAME[?overwrite=1]`: a dataset upload streamed to disk, never held in memory.
//
// The body (Content-Length or chunked, any Content-Type but multipart) goes to a hidden temporary
// file in the dataset folder, every write checked, at most max_upload_bytes (counted as it arrives,
// so chunked bodies are bounded too); then fsync and a rename onto NAME. Until that rename an
// existing NAME is untouched, whatever fails:
//   * NAME exists and overwrite is not asked for: 409 INPUT_VALIDATION_FAILED (checked before and
//     again at the rename, which never replaces a file then);
//   * the body is larger than the limit: 413 RUNTIME_UI_UPLOAD_TOO_LARGE with both numbers;
//   * the disk fills (ENOSPC, EDQUOT): 507 STATE_DISK_FULL; the temporary file is removed.
#pragma once

#include <cstddef>
#include <filesystem>

namespace httplib {
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace bp::ui {

// Answers the upload (JSON {name, bytes} or an error); throws bp::Error for the caller's guard.
void upload_dataset(const std::filesystem::path& data_dir, size_t max_upload_bytes, const httplib::Request& req,
                    httplib::Response& res, const httplib::ContentReader& content_reader);

}  // namespace bp::ui
