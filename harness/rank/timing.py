"""Timing in one place: CUDA events on GPU, perf_counter on CPU; a GPU sleep queued ahead of a timed call
(QueueAhead); warm-ups, and the first sample dropped."""

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


@dataclass
class QueueAhead:
    """Times a call's GPU work rather than the host's launch of it: a GPU sleep (torch.cuda._sleep) is enqueued
    before the start event, so the events and the call are queued while the GPU is still busy, as the kernels
    of a CUDA graph are when vLLM replays its forward pass. The sleep must outlast the host's enqueueing of the
    events and the call: where it did not (the GPU ran dry, the sample holds host time), the sample is counted
    as late and the sleep doubled for the next one. Only for CUDA devices."""

    device: torch.device
    sleep_us: float = 500.0  # the first guess; a few graph launches take tens of microseconds on the host
    max_sleep_us: float = 50_000.0
    cycles_per_us: float = 0.0
    late: int = 0
    samples: int = 0

    def calibrate(self, cycles: int = 1 << 22, repeats: int = 3) -> None:
        """The GPU clock as torch.cuda._sleep counts it: cycles per microsecond, from CUDA events."""
        rates = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / (start.elapsed_time(end) * 1e3))
        self.cycles_per_us = statistics.median(rates)

    def before(self) -> float:
        """Enqueue the sleep; the host clock from here to `after` is the enqueueing the sleep has to cover."""
        if not self.cycles_per_us:
            self.calibrate()
        torch.cuda._sleep(int(self.sleep_us * self.cycles_per_us))
        return time.perf_counter()

    def after(self, since: float) -> None:
        self.note((time.perf_counter() - since) * 1e6)

    def note(self, host_us: float) -> None:
        """One timed call whose enqueueing took host_us: late if it outlasted the sleep; past half of it the
        sleep doubles (up to max_sleep_us), so the next calls keep a margin."""
        self.samples += 1
        if host_us > self.sleep_us:
            self.late += 1
        if host_us > self.sleep_us / 2:
            self.sleep_us = min(2 * self.sleep_us, self.max_sleep_us)


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
