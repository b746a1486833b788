// Writing files safely, as opposed to the HDF5 objects inside them (data/h5.h): this pair owns
//   - AtomicWriter, which builds an HDF5 file under a temporary name and renames it into place;
//   - the temporary-name scheme (unique_temp_path), shared with train::write_file_atomic
//     (train/atomic_file.h), the atomic writer for plain (non-HDF5) files;
//   - the injected write budget (fail_writes_after), through which tests make every write of
//     the HDF5 file driver (data/h5_driver.cpp) and of train::write_file_atomic fail as if the
//     disk were full.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/h5.h"

namespace qkv::h5 {

// Fault injection for tests: after `bytes` more bytes, every write through the HDF5 driver and
// train::write_file_atomic fails as if the disk were full (ENOSPC); a negative value turns it
// off (the default). Only tests call it; a process started as the CLI never has a budget.
void fail_writes_after(int64_t bytes);
// Takes `n` bytes from the injected budget: false (with errno = ENOSPC) when it is exhausted.
bool injected_write_allowed(size_t n);

// A fresh temporary name next to `path`: PATH.tmp.<pid>.<counter>.<random>. Two processes (or
// threads) writing the same target never share one; writers still create it exclusively.
std::string unique_temp_path(const std::string& path);

// Writes PATH atomically: everything goes to a fresh temporary (unique_temp_path(), created
// exclusively), which commit() flushes, closes, fsyncs and renames over PATH. Destroyed without
// commit() (an error midway, a full disk), it removes the temporary and PATH is untouched.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path);
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter();
  File& file() { return file_; }
  const std::string& temp_path() const { return tmp_; }
  void commit();

 private:
  std::string path_, tmp_;
  File file_;
  bool done_ = false;
};

}  // namespace qkv::h5
