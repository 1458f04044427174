"""nccl: the packed-row path (collective.CollectiveComm) on GPU ranks.

Capacity-sized equal splits: every all_to_all_single moves each peer's full region, so nothing is read on the
host and a dispatch and a combine each capture in a CUDA graph (as symm-mem's do).
"""

from __future__ import annotations

from harness.rank.comm.collective import CollectiveComm


class NcclComm(CollectiveComm):
    name = "nccl"
