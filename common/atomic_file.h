// Files that appear whole or not at all, the one home of that rule: written to `<path>.tmp`,
// fsynced, renamed over `path`, and the directory fsynced so that the rename itself survives a
// crash. Used for checkpoints, port files and traces. Not thread-safe (one writer per file).
#ifndef SUMMA_COMMON_ATOMIC_FILE_H_
#define SUMMA_COMMON_ATOMIC_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace summa {

class AtomicFile {
 public:
  // Creates (truncates) `<path>.tmp`. INTERNAL naming the file when it cannot be created; the
  // directory must exist.
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path);
  // Removes the temporary file unless Commit succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

  // Appends `size` bytes; INTERNAL naming the file on failure.
  absl::Status Append(const void* data, size_t size);
  absl::Status Append(absl::string_view data) { return Append(data.data(), data.size()); }
  // Writes over bytes already appended (a length known only at the end).
  absl::Status WriteAt(absl::string_view data, off_t offset);

  // fsync, close, rename to path(), fsync of the directory. FAILED_PRECONDITION when called twice.
  absl::Status Commit();

 private:
  AtomicFile(std::string path, int fd);

  const std::string path_;
  const std::string tmp_;
  int fd_;  // -1 once committed
};

// The whole file at once: `contents` at `path`, atomically.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace summa

#endif  // SUMMA_COMMON_ATOMIC_FILE_H_
