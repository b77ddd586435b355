// The rule every reader of a named input follows before it opens it: only a regular file is read.
// A device has no end (/dev/zero, /dev/urandom) or no data, a FIFO without a writer blocks the
// open for ever, and none of them has a size to check against what the reader expects.
#pragma once
#include <string>

namespace moe::io {

// Throws moe::Error "<what> '<path>': is a directory" or "<what> '<path>': not a regular file (a
// character device)" (a block device, a FIFO, a socket). A regular file, or a link to one, passes;
// so does a missing path, which the caller's open reports in its own words.
void check_input_file(const std::string& path, const std::string& what);

// Whether `path` exists (links followed). A path the system cannot look up at all (a name longer
// than the file system allows, a loop of links) throws moe::Error "cannot look up '<path>': File
// name too long", never a std::filesystem exception.
bool path_exists(const std::string& path);

}  // namespace moe::io
