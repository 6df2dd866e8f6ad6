// Float buffers that start on a 64-byte line. A std::vector's large block comes from mmap at a page start plus
// glibc's 16-byte header, so every 16-float row of it straddled two cache lines: each 64-byte load or store of
// the kernels' work buffers touched two lines.

#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace scratchlm {

template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Aligned64<U>&) const { return true; }
  template <typename U>
  bool operator!=(const Aligned64<U>&) const { return false; }
};

using FloatBuf = std::vector<float, Aligned64<float>>;  // data() on a 64-byte line

// v with room for n values, grown only (a work buffer kept between calls: every user writes before it reads)
inline FloatBuf& sized(FloatBuf& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v;
}

}  // namespace scratchlm
