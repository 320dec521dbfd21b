#include "common/allocator.h"

#include <malloc.h>

#include <cstddef>

namespace summa {

void KeepFreedMemoryForReuse() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(static_cast<unsigned>(-1) >> 1));
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace summa
