"""Timing in one place: CUDA events on GPU, perf_counter on CPU; warm-ups, and the first sample dropped."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class StageTimer:
    """Times named stages of one iteration; `elapsed_us` resolves them after a synchronize."""

    device: torch.device
    _marks: list[tuple[str, object, object]] = field(default_factory=list)

    def start(self) -> object:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, name: str, started: object) -> None:
        self._marks.append((name, started, self.start()))

    def elapsed_us(self) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out = {name: a.elapsed_time(b) * 1e3 for name, a, b in self._marks}  # type: ignore[attr-defined]
        else:
            out = {name: (b - a) * 1e6 for name, a, b in self._marks}  # type: ignore[operator]
        self._marks.clear()
        return out


@dataclass(frozen=True, kw_only=True)
class SampleStats:
    """Median, min and max of timing samples in microseconds, the first sample dropped."""

    median_us: float
    min_us: float
    max_us: float
    num_samples: int  # kept samples


def stats_drop_first(samples: list[float]) -> SampleStats:
    """Median, min and max after dropping the first sample (cold caches, lazy init); NaN without samples.

    A single sample is kept: it is all there is.
    """
    kept = samples[1:] if len(samples) > 1 else samples
    if not kept:
        nan = float("nan")
        return SampleStats(median_us=nan, min_us=nan, max_us=nan, num_samples=0)
    return SampleStats(median_us=statistics.median(kept), min_us=min(kept), max_us=max(kept), num_samples=len(kept))
