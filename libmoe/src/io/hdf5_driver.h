// libmoe's own HDF5 file driver: POSIX pread/pwrite like HDF5's sec2, plus two things sec2
// cannot do.
//
// Writing: the first failed write (ENOSPC, EFBIG, EIO, ...) is recorded in the file's WriteStatus
// and reported to HDF5 once; every later write and truncate of that file is discarded and reported
// as done. HDF5 1.10 cannot close a file whose last flush fails: H5Fclose frees the file but
// leaves its identifier registered, and H5_term_library then closes it a second time (SIGSEGV at
// exit). A file whose writes have failed is thrown away anyway, so discarding lets it close
// cleanly; the writer then reports the recorded error (WriteFile::close).
//
// Reading: global heap collections (where files of earlier builds keep variable-length strings;
// they carry no checksum) are checked for a consistent layout before HDF5 parses them, because a
// damaged collection makes libhdf5 1.10 overrun a buffer or loop forever. Such files (superblock
// older than version 3, read-only) are read without HDF5's metadata accumulator so that every
// heap read reaches the driver.
#pragma once
#include <hdf5.h>

#include <memory>

#include "moe/io/hdf5.h"

namespace moe::io::h5 {

// Makes `fapl` use the driver. `status` (see moe/io/hdf5.h) receives the first write failure of a
// file opened for writing; null for files opened read-only.
void use_moe_driver(hid_t fapl, std::shared_ptr<WriteStatus> status, const Where& where);

// The driver's global heap check for a file held in memory (read through HDF5's core driver, not
// ours): an image of an earlier build's file (superblock older than version 3) is scanned for
// heap collections ("GCOL", version 1), and the first one whose objects do not tile it is
// described. Empty when nothing is wrong (always for images of files written now).
std::string damaged_image_heap(const std::string& bytes);

}  // namespace moe::io::h5
