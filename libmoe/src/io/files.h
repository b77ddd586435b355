// What the checkpoint and trace writers share: the file-system steps of atomic writes and the
// root attributes every moe HDF5 file carries.
#pragma once
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "moe/io/output.h"

namespace moe::io {

// Root attributes: format, format_version, producer (tool version (git ...)), producer_tool,
// producer_version, producer_git, argv, created (the provenance time, or now when empty).
void write_producer_attrs(hid_t file, const char* format, int version, const Provenance& p,
                          const h5::Where& root);

// fsync a file, or a directory after a rename in it (file systems that cannot fsync a directory
// are tolerated: the rename has happened). Throws moe::Error naming the path.
void fsync_path(const std::string& path, bool directory);
// Writes `text` to path.tmp-<pid>, fsyncs it and renames it over `path`: readers see the old file
// or the whole new one. Throws moe::Error naming the path and the cause; nothing is left behind.
void write_text_atomic(const std::string& path, const std::string& text);
// rename(temp, path) after check_replaceable(path): the one way every writer puts its temporary
// file in place. Throws moe::Error naming both paths; `temp` is left for the caller to remove.
void rename_into_place(const std::string& temp, const std::string& path);
// The directory holding `path` ("." for a bare file name).
std::string parent_directory(const std::string& path);

}  // namespace moe::io
