// What the checkpoint and trace writers share: the file-system steps under AtomicFile (fsync), a
// text file written through it, and the root attributes every moe HDF5 file carries.
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

// /tokenizer/<file>: the tokenizer's bytes as one u8 dataset (nothing when it is empty); every
// checkpoint writer calls this (io/checkpoint.cpp, io/convert_save.cpp).
void write_stored_tokenizer(hid_t file, const StoredTokenizer& tokenizer, const h5::Where& root);

// fsync a file, or a directory after a rename in it (file systems that cannot fsync a directory
// are tolerated: the rename has happened). Throws moe::Error naming the path.
void fsync_path(const std::string& path, bool directory);
// Writes `text` through an AtomicFile (path.tmp-<pid>, fsync, rename over `path`): readers see
// the old file or the whole new one; "-" writes it to stdout. Throws moe::Error naming the path
// and the cause; nothing is left behind.
void write_text_atomic(const std::string& path, const std::string& text);
// The directory holding `path` ("." for a bare file name).
std::string parent_directory(const std::string& path);

}  // namespace moe::io
