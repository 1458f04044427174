"""Timing in one place: CUDA events on GPU, perf_counter on CPU; warm-ups, and the first sample dropped."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
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


def median_drop_first(samples: list[float]) -> float:
    """Median of the samples after dropping the first (cold caches, lazy init)."""
    kept = samples[1:] if len(samples) > 1 else samples
    return statistics.median(kept) if kept else float("nan")


def spread(samples: list[float]) -> tuple[float, float]:
    kept = samples[1:] if len(samples) > 1 else samples
    return (min(kept), max(kept)) if kept else (float("nan"), float("nan"))


def bench(fn: Callable[[], object], *, device: torch.device, num_warmup: int = 2, num_iters: int = 10) -> list[float]:
    """Run `fn` num_warmup + num_iters times and return num_iters samples in microseconds."""
    for _ in range(num_warmup):
        fn()
    timer = StageTimer(device)
    samples: list[float] = []
    for _ in range(num_iters):
        started = timer.start()
        fn()
        timer.stop("fn", started)
        samples.append(timer.elapsed_us()["fn"])
    return samples
