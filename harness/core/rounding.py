"""How far a memory reading may stray from the bytes allocated, per measurement method: one source for the rank,
which records the allowance it measured with (MemoryMeasurement.allocator_rounding_bytes), and for the report's
checks, which judge by it.
"""

from __future__ import annotations

from harness.core.units import MIB

# The CUDA driver maps device memory, and NVML reads "used", in 2 MiB pages; the caching allocator hands out large
# blocks in 2 MiB steps and small ones from 2 MiB segments: two readings of one warmed state differ by whole pages.
CUDA_PAGE_BYTES = 2 * MIB
# A small tensor (a 1-10 MiB request) takes a 20 MiB segment of the caching allocator: at most one per buffer.
CUDA_SMALL_SEGMENT_BYTES = 20 * MIB
# RSS between two equal states moves with the interpreter's and malloc's own bookkeeping (arenas, freelists,
# thread stacks) even after malloc_trim. Measured on the CPU smoke run (2 ranks, a CPU burner beside them): the
# policies' baselines stay within 0.46-0.51 MiB after the rank's warm-up pass; without it they differed by 13 MB.
RSS_ROUNDING_BYTES = 4 * MIB
# One RSS reading of a workspace's allocation can carry what the process's other threads (Ray's, gloo's, the peak
# sampler's) allocated inside its window: the Ray-launched CPU smoke read 8.21 and 8.22 MiB for an 8.00 MiB workspace
# on one rank in two loaded suite runs (the other ranks 8.004-8.008), within the 0.46-0.51 MiB that equal states
# read apart (RSS_ROUNDING_BYTES's measurement). The memory check allows at least this on RSS, as it allows the
# allocator's segments on NVML.
RSS_READ_SLACK_BYTES = MIB // 2
# Records from before the warm-up pass carry no allowance of their own: glibc keeps freed heap memory resident up
# to M_TRIM_THRESHOLD, which its dynamic mmap threshold raises to at most 2 x 32 MiB after a large free
# (mallopt(3)); equal states read equal to within that.
PRE_WARMUP_RSS_ROUNDING_BYTES = 64 * MIB

# By measurement method ("nvml" on GPUs, "rss" on CPUs): what a rank records, and what the checks take for a record
# that carries no allowance of its own.
BASELINE_ROUNDING_BYTES = {"nvml": CUDA_PAGE_BYTES, "rss": RSS_ROUNDING_BYTES}
UNRECORDED_BASELINE_ROUNDING_BYTES = {"nvml": CUDA_PAGE_BYTES, "rss": PRE_WARMUP_RSS_ROUNDING_BYTES}
