#pragma once
// Note [Huge pages for fresh tensor memory]
// Memory fresh from the allocator is faulted in by the kernel a 4 KiB page at
// a time on first touch: filling 40 MB of it took three quarters of a
// checkpoint load's time (10,000 faults, about 14 ms), and a third of the
// first asynchronous save's copy. Asked for transparent huge pages, the kernel
// faults such memory in 2 MiB pages where its setting allows them
// (/sys/kernel/mm/transparent_hugepage/enabled "always" or "madvise"); where
// it does not, the advice changes nothing. Only blocks of megabytes are worth
// asking for, and only before they are first written.

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace fulgor::detail {

constexpr size_t kHugePagesWorthAsking = size_t{4} << 20;

inline void advise_huge_pages(void* memory, size_t size) {
  if (size < kHugePagesWorthAsking) return;
  constexpr uintptr_t kPage = 4096;
  const auto begin = reinterpret_cast<uintptr_t>(memory);
  const uintptr_t first = (begin + kPage - 1) & ~(kPage - 1), last = (begin + size) & ~(kPage - 1);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

}  // namespace fulgor::detail
