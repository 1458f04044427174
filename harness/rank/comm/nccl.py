"""nccl: the packed-row path (collective.CollectiveComm) on GPU ranks.

One host read per dispatch remains: all_to_all_single takes variable split sizes as Python ints, so the counts
(exchanged with one fixed-size all_to_all_single) are read once; combine reuses them. Everything else stays on
the device. symm-mem avoids even that read.
"""

from __future__ import annotations

from harness.rank.comm.collective import CollectiveComm


class NcclComm(CollectiveComm):
    name = "nccl"
