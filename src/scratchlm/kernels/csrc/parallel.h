// Splitting a kernel's rows over torch's intra-op threads by chunks handed out as the threads ask for them.
//
// at::parallel_for gives each thread one fixed contiguous share; when the OS takes a core away for a moment
// (the server's event loop streaming a token, an HTTP client on the same machine, another process) the whole
// region waits for the preempted thread's share. Here the chunks are cut into one contiguous segment per thread,
// each with its own counter: a thread takes its segment's chunks in order, then helps the other segments, so a
// preempted thread holds up at most the chunk it is on and the others finish its share. In order, because the
// decode kernels prefetch rows ahead of the one they read: with one shared counter two threads alternated chunks
// and every chunk's prefetches ran into the other thread's rows (Zen 4, Q4_K 8192 x 2048 in 128-row chunks, 2
// threads streaming: 23.4 GB/s shared, 24.7 by segments, 25.4 in two halves). The chunks are the same rows
// whichever thread runs them: results do not depend on the split.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace scratchlm {

constexpr int64_t MIN_SPLIT_BYTES = 64 * 1024;    // below this much weight a matrix runs on one thread
constexpr int64_t CHUNK_BYTES = 32 * 1024;        // at least this much weight per chunk (one atomic each)
constexpr int64_t MAX_CHUNKS = 64;                // and at most this many chunks per call
// rows per chunk a multiple of the kernels' row tiles (4, 8; 6, 12 in block_gemm.h; 16 groups in gemv_r16.h)
constexpr int64_t ROW_ALIGN = 48;

// Rows per chunk for n rows of row_bytes bytes each (n: no split). Callers pass the work per row (a matrix row's
// bytes times the tokens that read it): a prompt's 128 tokens make every row 128x the work of a decode step's,
// and chunks sized by bytes alone left 5 chunks of a 576-row matrix for 2 threads (one idle 40% of the call).
inline int64_t row_chunk(int64_t n, int64_t row_bytes) {
  const int64_t total = n * std::max<int64_t>(row_bytes, 1);
  if (total <= MIN_SPLIT_BYTES) return std::max<int64_t>(n, 1);
  const int64_t bytes = std::max(CHUNK_BYTES, (total + MAX_CHUNKS - 1) / MAX_CHUNKS);
  const int64_t rows = std::max<int64_t>(1, bytes / std::max<int64_t>(row_bytes, 1));
  return std::min(n, (rows + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN);
}

// fn(i0, i1) over [0, n) in chunks of `chunk` items, each chunk on whichever thread takes it next.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), chunks);
  if (threads <= 1 || at::in_parallel_region()) return fn(0, n);
  struct alignas(64) Counter {  // one cache line each
    std::atomic<int64_t> next;
  };
  std::unique_ptr<Counter[]> seg(new Counter[threads]);
  auto start = [&](int64_t s) { return s * chunks / threads; };  // segment s: chunks [start(s), start(s + 1))
  for (int64_t s = 0; s < threads; ++s) seg[s].next.store(start(s), std::memory_order_relaxed);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < threads; ++k) {  // its own segment first, then the others'
        const int64_t s = (t + k) % threads, end = start(s + 1);
        for (int64_t c = seg[s].next.fetch_add(1, std::memory_order_relaxed); c < end;
             c = seg[s].next.fetch_add(1, std::memory_order_relaxed))
          fn(c * chunk, std::min(n, (c + 1) * chunk));
      }
  });
}

}  // namespace scratchlm
