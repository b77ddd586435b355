// A failed HDF5 call in the user's words. HDF5's error stack describes the library's internals
// ("unable to open file: time = ..., name = ..., tent_flags = 13; open failed; ..."), and the
// statement that failed is C++ (`H5Fcreate(path.c_str(), ...)`): both go to the debug log (-v);
// the message says what was being done and why it failed.
#pragma once
#include <string>
#include <vector>

namespace moe::io::h5 {

struct ErrorStack {
  std::vector<std::string> causes;  // every description, outermost first, de-duplicated
  std::string ours;       // the innermost cause our driver gave (an errno in words), or empty
  bool checksum = false;  // a checksum (metadata or Fletcher32) did not match
};

// Takes HDF5's current error stack (and clears it).
ErrorStack take_errors();

// Why it failed, in words: our driver's cause ("write of 16388 bytes at offset 118784 of 'x.h5'
// failed: No space left on device"), else "the file is damaged: checksum mismatch", else HDF5's
// innermost description.
std::string cause_in_words(const ErrorStack& errors);

// What a checked call was doing, from its statement: "H5Fcreate(...)" -> "creating the file",
// "H5Lget_name_by_idx(...)" -> "listing the group", "H5Dread(...)" -> "reading the data".
std::string action_of(const char* statement);

// Why `path` could not be created, when its directory is the reason: "directory 'out' does not
// exist", "'out' is not a directory", "no permission to write in directory 'out'"; else empty.
std::string directory_problem(const std::string& path);

}  // namespace moe::io::h5
