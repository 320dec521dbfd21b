// The allocator settings of Summa's processes. A step of the data path frees and allocates
// buffers of the same sizes over and over (gRPC's receive buffers above all); glibc's defaults
// hand big ones back to the kernel (mmap/munmap, trimming, one heap per thread arena) and the
// next step touches fresh pages: measured on a 64 MiB two-rank AllReduce, ~7,000 minor faults a
// call and a third of the server's time in the page-fault path. With one arena, no mmap'd chunks
// and no trimming, freed memory is reused as it is: the process keeps its peak, and steps stop
// faulting. Call first thing in main, before any thread starts.
#ifndef SUMMA_COMMON_ALLOCATOR_H_
#define SUMMA_COMMON_ALLOCATOR_H_

namespace summa {

void KeepFreedMemoryForReuse();

}  // namespace summa

#endif  // SUMMA_COMMON_ALLOCATOR_H_
