// Internal to data/h5*.cpp: the HDF5 file driver every file made by File::create writes through.
// Plain POSIX I/O like HDF5's default "sec2" driver, with the same feature flags (so files come
// out byte-identical), except that a failed write (disk full, quota, I/O error, or an injected
// failure: fail_writes_after, data/h5_atomic.h) is recorded in the File's WriteStatus and
// reported to HDF5 as a success. HDF5 then closes the file normally instead of crashing in its
// exit-time cleanup, and File::check_writes() turns the recorded error into the one-line
// qkv::Error.
#pragma once
#include <hdf5.h>

#include "data/h5.h"

namespace qkv::h5 {

// The first failed write of a file made by File::create (0 = none), and the errno of the last
// failed open (for File::create's message).
struct File::WriteStatus {
  int err = 0;
  int open_err = 0;
};

// What File::create hands the driver through the file-access property list.
struct DriverInfo {
  File::WriteStatus* status;
};

// The driver's id, registered with HDF5 on first use.
hid_t guarded_driver();

}  // namespace qkv::h5
