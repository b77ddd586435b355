#include "io/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "moe/error.h"
#include "moe/io/atomic_file.h"

namespace moe::io {

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) throw Error(str("cannot open '", path, "' to fsync it: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename itself has happened.
  if (rc != 0 && !(directory && (err == EINVAL || err == ENOTSUP)))
    throw Error(str("fsync '", path, "' failed: ", std::strerror(err)));
}

void write_producer_attrs(hid_t file, const char* format, int version, const Provenance& p,
                          const h5::Where& root) {
  h5::Group r(MOE_H5(root, H5Gopen2(file, "/", H5P_DEFAULT)));
  h5::write_string_attr(r, "format", format, root);
  h5::write_int_attr(r, "format_version", version, root, H5T_STD_I32LE);
  std::string producer = p.tool;
  if (!p.version.empty()) producer += " " + p.version;
  if (!p.git.empty()) producer += " (git " + p.git + ")";
  h5::write_string_attr(r, "producer", producer, root);
  h5::write_string_attr(r, "producer_tool", p.tool, root);
  h5::write_string_attr(r, "producer_version", p.version, root);
  h5::write_string_attr(r, "producer_git", p.git, root);
  h5::write_string_attr(r, "argv", p.argv, root);
  h5::write_string_attr(r, "created", p.time.empty() ? utc_timestamp() : p.time, root);
}

void write_text_atomic(const std::string& path, const std::string& text) {
  if (path == "-") {  // stdout, as everywhere in the tools
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
      throw Error(str("writing to stdout: ", std::strerror(errno)));
    return;
  }
  AtomicFile out(path);
  std::FILE* f = std::fopen(out.temp().c_str(), "wb");
  if (!f) throw Error(str("cannot write '", path, "': ", std::strerror(errno)));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  out.commit();  // a failure removes the temp (the destructor)
}

std::string parent_directory(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace moe::io
