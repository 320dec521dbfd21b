// Byte sizes as people write them on command lines: "4096", "64K", "1MiB", "1G". K, KB and KiB
// all mean 1024, as in nccl-tests (likewise M and G). Plain functions; thread-safe.
#ifndef SUMMA_COMMON_BYTE_SIZE_H_
#define SUMMA_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace summa {

// "4096", "4K", "4KiB", "64KB", "1M", "256MiB", "1G" (any case, surrounding blanks ignored).
// INVALID_ARGUMENT for anything else, a negative number or more than 2^62 bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);
// The shortest exact form: 4096 -> "4KiB", 1 << 20 -> "1MiB", 1000 -> "1000B".
std::string FormatByteSize(int64_t bytes);

}  // namespace summa

#endif  // SUMMA_COMMON_BYTE_SIZE_H_
