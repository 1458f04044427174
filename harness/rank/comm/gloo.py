"""gloo: the packed-row path (collective.CollectiveComm) on CPU ranks, for CI and machines without GPUs: the same
equal splits as nccl (CPU ranks never capture: harness.rank.graphs)."""

from __future__ import annotations

from harness.rank.comm.collective import CollectiveComm


class GlooComm(CollectiveComm):
    name = "gloo"
