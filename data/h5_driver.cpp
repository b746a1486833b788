// The write-guarding HDF5 file driver (see data/h5_driver.h).
#include "data/h5_driver.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "data/h5_atomic.h"

namespace qkv::h5 {
namespace {

// From the first failed write on, data writes are dropped and metadata writes are kept in memory
// (HDF5 may read its own metadata back before it closes the file), so it closes normally.
struct DriverState {
  int fd = -1;
  bool writable = false;
  haddr_t eoa = 0, eof = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  File::WriteStatus* status = nullptr;
  int err = 0;
  std::vector<std::pair<haddr_t, std::vector<char>>> overlay;  // metadata written after a failure
};
struct DriverFile {
  H5FD_t pub;  // must come first: HDF5 hands back this pointer
  DriverState* st;
};

DriverState* state_of(const H5FD_t* f) { return reinterpret_cast<const DriverFile*>(f)->st; }

void record_failure(DriverState* st, int err) {
  if (st->err) return;
  st->err = err ? err : EIO;
  if (st->status && !st->status->err) st->status->err = st->err;
}

H5FD_t* drv_open(const char* name, unsigned flags, hid_t fapl, haddr_t) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  File::WriteStatus* status = info ? info->status : nullptr;
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  const int fd = ::open(name, o | O_CLOEXEC, 0666);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    if (status) status->open_err = errno;
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  auto* f = new DriverFile{};
  f->st = new DriverState;
  f->st->fd = fd;
  f->st->writable = (flags & H5F_ACC_RDWR) != 0;
  f->st->eof = static_cast<haddr_t>(st.st_size);
  f->st->dev = st.st_dev;
  f->st->ino = st.st_ino;
  f->st->status = status;
  return &f->pub;
}

herr_t drv_close(H5FD_t* file) {
  auto* f = reinterpret_cast<DriverFile*>(file);
  DriverState* st = f->st;
  if (::close(st->fd) != 0 && st->writable) record_failure(st, errno);
  delete st;
  delete f;
  return 0;
}

int drv_cmp(const H5FD_t* a, const H5FD_t* b) {
  const DriverState *x = state_of(a), *y = state_of(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t drv_query(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t drv_get_eoa(const H5FD_t* f, H5FD_mem_t) { return state_of(f)->eoa; }
herr_t drv_set_eoa(H5FD_t* f, H5FD_mem_t, haddr_t addr) {
  state_of(f)->eoa = addr;
  return 0;
}
haddr_t drv_get_eof(const H5FD_t* f, H5FD_mem_t) { return state_of(f)->eof; }
herr_t drv_get_handle(H5FD_t* f, hid_t, void** handle) {
  *handle = &state_of(f)->fd;
  return 0;
}

herr_t drv_read(H5FD_t* f, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  DriverState* st = state_of(f);
  char* out = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(st->fd, out + done, size - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) {  // past the end of the file: HDF5 expects zeros
      std::memset(out + done, 0, size - done);
      break;
    }
    done += static_cast<size_t>(n);
  }
  for (const auto& [at, bytes] : st->overlay) {  // in write order: later writes win
    const haddr_t lo = std::max(at, addr), hi = std::min<haddr_t>(at + bytes.size(), addr + size);
    if (lo < hi) std::memcpy(out + (lo - addr), bytes.data() + (lo - at), hi - lo);
  }
  return 0;
}

herr_t drv_write(H5FD_t* f, H5FD_mem_t type, hid_t, haddr_t addr, size_t size, const void* buf) {
  DriverState* st = state_of(f);
  const char* in = static_cast<const char*>(buf);
  st->eof = std::max<haddr_t>(st->eof, addr + size);
  if (!st->err) {
    if (!injected_write_allowed(size)) {
      record_failure(st, errno);
    } else {
      size_t done = 0;
      while (done < size) {
        const ssize_t n = ::pwrite(st->fd, in + done, size - done, static_cast<off_t>(addr + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          record_failure(st, n < 0 ? errno : ENOSPC);
          break;
        }
        done += static_cast<size_t>(n);
      }
      if (!st->err) return 0;
    }
  }
  // The file is lost anyway (the caller throws and removes it); keep what HDF5 may read back.
  if (type != H5FD_MEM_DRAW) st->overlay.emplace_back(addr, std::vector<char>(in, in + size));
  return 0;
}

herr_t drv_truncate(H5FD_t* f, hid_t, hbool_t) {
  DriverState* st = state_of(f);
  if (st->err || st->eoa == st->eof) return 0;
  if (::ftruncate(st->fd, static_cast<off_t>(st->eoa)) != 0) record_failure(st, errno);
  else st->eof = st->eoa;
  return 0;
}

}  // namespace

hid_t guarded_driver() {
  static const hid_t id = [] {
    static H5FD_class_t c{};
#if H5_VERSION_GE(1, 13, 2)
    c.version = H5FD_CLASS_VERSION;
    c.value = static_cast<H5FD_class_value_t>(369);  // in the range HDF5 leaves to applications
#endif
    c.name = "qkv_guarded_posix";
    c.maxaddr = (static_cast<haddr_t>(1) << (8 * sizeof(off_t) - 1)) - 1;
    c.fc_degree = H5F_CLOSE_WEAK;
    c.fapl_size = sizeof(DriverInfo);
    c.open = drv_open;
    c.close = drv_close;
    c.cmp = drv_cmp;
    c.query = drv_query;
    c.get_eoa = drv_get_eoa;
    c.set_eoa = drv_set_eoa;
    c.get_eof = drv_get_eof;
    c.get_handle = drv_get_handle;
    c.read = drv_read;
    c.write = drv_write;
    c.truncate = drv_truncate;
    const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
    std::copy(map, map + H5FD_MEM_NTYPES, c.fl_map);
    return H5FDregister(&c);
  }();
  return id;
}

}  // namespace qkv::h5
