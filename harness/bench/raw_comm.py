"""The raw collectives the bench sets against the harness's dispatch and combine: all_to_all_single of the same
payloads with the same splits, and nothing else.

    a2a:raw-dispatch     the FP8 rows and their words, as dispatch sends them
    a2a:raw-combine      the bf16 expert outputs, as combine sends them back
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:
    from harness.rank.dispatch import DispatchBuffers, DispatchHandle


def raw_dispatch(buffers: DispatchBuffers, handle: DispatchHandle) -> Callable[[], None]:
    b, num_send, num_recv = buffers, handle.num_send_rows, handle.num_recv_rows

    def run() -> None:
        for recv, send in ((b.recv_x, b.send_x), (b.recv_meta, b.send_meta)):
            dist.all_to_all_single(recv[:num_recv], send[:num_send],
                                   output_split_sizes=handle.recv_splits, input_split_sizes=handle.send_splits)

    return run


def raw_combine(buffers: DispatchBuffers, handle: DispatchHandle) -> Callable[[], None]:
    b, num_send, num_recv = buffers, handle.num_send_rows, handle.num_recv_rows

    def run() -> None:
        dist.all_to_all_single(b.combine_recv[:num_send], b.combine_send[:num_recv],
                               output_split_sizes=handle.send_splits, input_split_sizes=handle.recv_splits)

    return run
