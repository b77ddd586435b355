// Input-path rule shared by every reader (see moe/io/input.h).
#include "moe/io/input.h"

#include <filesystem>

#include "moe/error.h"

namespace moe::io {

namespace {

const char* kind_of(std::filesystem::file_type type) {
  using std::filesystem::file_type;
  switch (type) {
    case file_type::character:
      return "a character device";
    case file_type::block:
      return "a block device";
    case file_type::fifo:
      return "a FIFO";
    case file_type::socket:
      return "a socket";
    default:
      return "neither a file nor a directory";
  }
}

}  // namespace

void check_input_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);  // follows links: a link to a file reads
  if (ec || !fs::exists(status) || fs::is_regular_file(status)) return;
  if (fs::is_directory(status)) throw Error(str(what, " '", path, "': is a directory"));
  throw Error(str(what, " '", path, "': not a regular file (", kind_of(status.type()),
                  "); give the path of a file"));
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  const bool there = std::filesystem::exists(path, ec);
  if (ec) throw Error(str("cannot look up '", path, "': ", ec.message()));
  return there;
}

}  // namespace moe::io
