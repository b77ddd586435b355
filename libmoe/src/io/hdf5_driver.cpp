// The moe HDF5 file driver (see hdf5_driver.h): POSIX I/O with a write-failure latch and checked
// global heap reads. Called by libhdf5 only, under the h5::Session lock.
#include "io/hdf5_driver.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "moe/error.h"
#include "moe/io/hdf5.h"

namespace moe::io::h5 {

namespace {

struct DriverInfo {
  std::shared_ptr<WriteStatus> status;  // null: read-only, heap reads checked
};

struct PosixFile {
  H5FD_t pub;  // first: HDF5 sees a PosixFile* as an H5FD_t*
  int fd = -1;
  haddr_t eoa = 0, eof = 0;
  dev_t device = 0;
  ino_t inode = 0;
  // Shared with the WriteFile: a file whose objects outlive its WriteFile closes later, and
  // still writes (or discards) through it.
  std::shared_ptr<WriteStatus> status;
  bool check_heaps = false;  // read-only and written with a superblock older than version 3
  std::string name;
};

// HDF5 hands back the H5FD_t* that open() returned; it is the first member of a standard-layout
// PosixFile, so the two pointers are interconvertible.
static_assert(std::is_standard_layout_v<PosixFile>);
PosixFile* file_of(H5FD_t* f) { return reinterpret_cast<PosixFile*>(f); }
const PosixFile* file_of(const H5FD_t* f) { return reinterpret_cast<const PosixFile*>(f); }

const haddr_t kMaxAddress = static_cast<haddr_t>(std::numeric_limits<off_t>::max());

herr_t push_error(hid_t minor, const std::string& message) {
  H5Epush2(H5E_DEFAULT, __FILE__, "moe driver", __LINE__, H5E_ERR_CLS, H5E_VFL, minor, "%s",
           message.c_str());
  return -1;
}

// The first failure of a written file is reported; from then on the file is being thrown away and
// every write "succeeds" without touching it, so that HDF5 can still close it.
herr_t write_failed(PosixFile& f, int err, const std::string& what) {
  f.status->error = err;
  f.status->what = what;
  // While closing, HDF5 must see success: a failed H5Fclose cannot be recovered from.
  if (f.status->closing) return 0;
  return push_error(H5E_WRITEERROR, str(what, " failed: ", std::strerror(err)));
}

uint64_t little_endian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A global heap collection (HDF5 file format, "Global Heap"): "GCOL", version 1, 3 reserved bytes,
// the collection size (8 bytes in every file we read), then objects, each a 16-byte header (index
// 2, reference count 2, reserved 4, size 8) and its data padded to 8 bytes; index 0 is the free
// space, which runs to the end. The objects must tile the collection exactly and lie in the file.
// `buffer` may hold only the start of the collection (HDF5 reads 4 KiB first): what it holds is
// checked, the rest is checked when HDF5 reads the whole collection.
std::string check_global_heap(const unsigned char* buffer, size_t bytes, haddr_t addr,
                              haddr_t eof) {
  if (bytes < 16) return "";
  if (std::memcmp(buffer, "GCOL", 4) != 0) return "no GCOL signature";
  if (buffer[4] != 1) return str("version ", int(buffer[4]), ", expected 1");
  const uint64_t size = little_endian(buffer + 8, 8);
  if (size < 4096 || size > eof || addr > eof - size)
    return str("collection size ", size, " at offset ", addr, " does not fit the file (", eof,
               " bytes)");
  uint64_t at = 16;
  const uint64_t visible = std::min<uint64_t>(size, bytes);
  while (at + 16 <= visible) {
    const uint64_t index = little_endian(buffer + at, 2);
    const uint64_t object = little_endian(buffer + at + 8, 8);
    if (index == 0) {
      if (object != size - at || object < 16)
        return str("free space of ", object, " bytes at ", at, ", the collection has ", size - at,
                   " left");
      return "";
    }
    if (object > size - at - 16) return str("object ", index, " of ", object, " bytes overruns");
    at += 16 + (object + 7) / 8 * 8;
  }
  if (visible == size && at != size) return str("objects end at ", at, ", not at ", size);
  return "";
}

void* fapl_copy(const void* info) {
  return new (std::nothrow) DriverInfo(*static_cast<const DriverInfo*>(info));
}

herr_t fapl_free(void* info) {
  delete static_cast<DriverInfo*>(info);
  return 0;
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  if (!name || !*name || maxaddr == 0 || maxaddr > kMaxAddress) {
    push_error(H5E_BADVALUE, "moe driver: invalid file name or address space");
    return nullptr;
  }
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  int oflags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) oflags |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) oflags |= O_CREAT;
  if (flags & H5F_ACC_EXCL) oflags |= O_EXCL;
  int fd = ::open(name, oflags | O_CLOEXEC, 0666);
  if (fd < 0) {
    push_error(H5E_CANTOPENFILE, str("cannot open '", name, "': ", std::strerror(errno)));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    push_error(H5E_CANTOPENFILE, str("cannot stat '", name, "': ", std::strerror(err)));
    return nullptr;
  }
  auto* f = new (std::nothrow) PosixFile();
  if (!f) {
    ::close(fd);
    push_error(H5E_CANTALLOC, "moe driver: out of memory");
    return nullptr;
  }
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  f->status = info && (flags & H5F_ACC_RDWR) ? info->status : nullptr;
  f->name = name;
  // Files we write now have no global heap (docs/FORMATS.md); those of earlier builds
  // (superblock version 2, at byte 8 after the signature) do.
  unsigned char head[9] = {};
  f->check_heaps = !f->status && ::pread(fd, head, sizeof head, 0) == sizeof head &&
                   std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) == 0 && head[8] < 3;
  return &f->pub;
}

herr_t close_file(H5FD_t* file) {
  PosixFile* f = file_of(file);
  const int rc = ::close(f->fd);
  const int err = errno;
  const std::string name = f->name;
  const bool failed_already = f->status && f->status->error;
  delete f;
  // A close error of a file we are throwing away must not fail H5Fclose (see the header).
  if (rc != 0 && !failed_already)
    return push_error(H5E_CANTCLOSEFILE, str("cannot close '", name, "': ", std::strerror(err)));
  return 0;
}

int compare(const H5FD_t* a, const H5FD_t* b) {
  const PosixFile* x = file_of(a);
  const PosixFile* y = file_of(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t* file, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
  // Files with global heaps to check: no metadata accumulator, so every heap read comes to
  // read() below.
  if (!file || !file_of(file)->check_heaps) *flags |= H5FD_FEAT_ACCUMULATE_METADATA;
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t) { return file_of(file)->eoa; }

herr_t set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  if (addr > kMaxAddress) return push_error(H5E_OVERFLOW, "moe driver: address overflow");
  file_of(file)->eoa = addr;
  return 0;
}

haddr_t get_eof(const H5FD_t* file, H5FD_mem_t) { return file_of(file)->eof; }

herr_t get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &file_of(file)->fd;
  return 0;
}

herr_t read(H5FD_t* file, H5FD_mem_t type, hid_t, haddr_t addr, size_t size, void* buffer) {
  PosixFile* f = file_of(file);
  if (addr > kMaxAddress || size > kMaxAddress - addr)
    return push_error(H5E_OVERFLOW, str("read beyond the address space of '", f->name, "'"));
  auto* out = static_cast<unsigned char*>(buffer);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(f->fd, out + done, size - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return push_error(H5E_READERROR, str("read of ", size, " bytes at offset ", addr, " of '",
                                           f->name, "' failed: ", std::strerror(errno)));
    if (n == 0) break;  // past the end of the file: zeros, as sec2 gives
    done += static_cast<size_t>(n);
  }
  std::memset(out + done, 0, size - done);
  // HDF5 reads global heap collections as raw data (H5F_block_read maps H5FD_MEM_GHEAP to
  // H5FD_MEM_DRAW): recognised by their signature, at the sizes HDF5 reads them (4 KiB first,
  // then the whole collection).
  if (f->check_heaps && type == H5FD_MEM_DRAW && size >= 16 && std::memcmp(out, "GCOL", 4) == 0 &&
      (size == 4096 || size == little_endian(out + 8, 8))) {
    std::string problem = check_global_heap(out, size, addr, f->eof);
    if (!problem.empty())
      return push_error(H5E_READERROR, str("damaged global heap at offset ", addr, " of '", f->name,
                                           "': ", problem));
  }
  return 0;
}

herr_t write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buffer) {
  PosixFile* f = file_of(file);
  if (f->status && f->status->error) return 0;  // being thrown away (see the header)
  if (addr > kMaxAddress || size > kMaxAddress - addr)
    return push_error(H5E_OVERFLOW, str("write beyond the address space of '", f->name, "'"));
  const auto* in = static_cast<const unsigned char*>(buffer);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(f->fd, in + done, size - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      const std::string what =
          str("write of ", size, " bytes at offset ", addr, " of '", f->name, "'");
      if (f->status) return write_failed(*f, err, what);
      return push_error(H5E_WRITEERROR, str(what, " failed: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  f->eof = std::max<haddr_t>(f->eof, addr + size);
  return 0;
}

herr_t truncate(H5FD_t* file, hid_t, hbool_t) {
  PosixFile* f = file_of(file);
  if (f->status && f->status->error) return 0;
  if (f->eoa == f->eof) return 0;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) {
    const int err = errno;
    const std::string what = str("setting the size of '", f->name, "' to ", f->eoa, " bytes");
    if (f->status) return write_failed(*f, err, what);
    return push_error(H5E_WRITEERROR, str(what, " failed: ", std::strerror(err)));
  }
  f->eof = f->eoa;
  return 0;
}

herr_t lock(H5FD_t* file, hbool_t rw) {
  PosixFile* f = file_of(file);
  if (::flock(f->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return 0;
  // File systems without locks (ENOSYS, ENOLCK, EOPNOTSUPP) are tolerated, like
  // H5Pset_file_locking(..., ignore_when_disabled = true) does for sec2.
  if (errno == ENOSYS || errno == ENOLCK || errno == EOPNOTSUPP) return 0;
  return push_error(H5E_CANTLOCKFILE, str("cannot lock '", f->name, "': ", std::strerror(errno),
                                          " (is another process writing it?)"));
}

herr_t unlock(H5FD_t* file) {
  PosixFile* f = file_of(file);
  if (::flock(f->fd, LOCK_UN) == 0 || errno == ENOSYS || errno == ENOLCK || errno == EOPNOTSUPP)
    return 0;
  return push_error(H5E_CANTUNLOCKFILE, str("cannot unlock '", f->name, "'"));
}

H5FD_class_t make_class() {
  H5FD_class_t c{};
  c.name = "moe_posix";
  c.maxaddr = kMaxAddress;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DriverInfo);
  c.fapl_copy = fapl_copy;
  c.fapl_free = fapl_free;
  c.open = open_file;
  c.close = close_file;
  c.cmp = compare;
  c.query = query;
  c.get_eoa = get_eoa;
  c.set_eoa = set_eoa;
  c.get_eof = get_eof;
  c.get_handle = get_handle;
  c.read = read;
  c.write = write;
  c.truncate = truncate;
  c.lock = lock;
  c.unlock = unlock;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::copy(map, map + H5FD_MEM_NTYPES, c.fl_map);
  return c;
}

hid_t driver_id(const Where& where) {
  static hid_t id = -1;  // guarded by the h5::Session lock
  if (id < 0 || H5Iis_valid(id) <= 0) {
    static const H5FD_class_t kClass = make_class();
    id = MOE_H5(where, H5FDregister(&kClass));
  }
  return id;
}

}  // namespace

void use_moe_driver(hid_t fapl, std::shared_ptr<WriteStatus> status, const Where& where) {
  DriverInfo info{std::move(status)};
  MOE_H5(where, H5Pset_driver(fapl, driver_id(where), &info));
}

std::string damaged_image_heap(const std::string& bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n < 9 || std::memcmp(data, "\x89HDF\r\n\x1a\n", 8) != 0 || data[8] >= 3) return "";
  // Collections sit anywhere; a "GCOL" of version 1 inside tensor data would be a false alarm
  // (5 given bytes in a row), far less likely than the damage this catches.
  for (size_t at = 0; at + 16 <= n; ++at) {
    if (data[at] != 'G' || std::memcmp(data + at, "GCOL", 4) != 0 || data[at + 4] != 1) continue;
    const std::string problem = check_global_heap(data + at, n - at, at, n);
    if (!problem.empty()) return str("damaged global heap at offset ", at, ": ", problem);
  }
  return "";
}

}  // namespace moe::io::h5
