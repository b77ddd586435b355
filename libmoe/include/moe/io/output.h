// Rules every writer follows before it puts a file in place, so that no tool destroys what it was
// not asked to replace: outputs are written to a temporary file and renamed over the target, and
// a rename must never land on a device node, a FIFO, a directory or a symbolic link.
#pragma once
#include <string>
#include <vector>

namespace moe::io {

// Throws moe::Error when `path` exists and is not a regular file (a device such as /dev/full, a
// FIFO, a socket, a directory, or a symbolic link, which a rename would replace rather than
// follow): the message names the path and what it is. A missing path or a regular file passes.
void check_replaceable(const std::string& path);

// For tools' single-file outputs (-o FILE): check_replaceable(path), then, when `path` exists and
// `replace` is false, moe::Error "'path' already exists; remove it or pass --force to replace it".
void check_output_file(const std::string& path, bool replace);

// For outputs written in place rather than renamed over (text streams: JSON lines, summaries):
// when `path` names an existing regular file (a link followed to one) and `replace` is false, the
// same moe::Error as check_output_file. "-" (stdout), an empty path (no output), a missing path
// and a device or FIFO (written into, never replaced: /dev/null, /dev/stdout) pass. The one
// overwrite rule of every tool: an existing file is replaced only with --force.
void check_output_stream(const std::string& path, bool replace);

// Temporary files that interrupted moe writers left in `dir` (NAME.h5.tmp-PID,
// NAME.h5.convert-PID, and .last.h5.tmp-PID / .last.tmp-PID of the `last` link) whose process PID
// is no longer alive on this machine: they are removed and their paths returned, so that the
// caller can say so. So are the step-<8 digits> directories of sharded saves that never finished
// (one holding a dead process's temporary, or nothing), never the one `last` names. Files of live
// processes (another run writing into the same directory) and names moe does not write are kept.
// A missing directory returns nothing.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace moe::io
