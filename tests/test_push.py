"""symm-mem's device-side kernels (harness.rank.comm.push): each Triton form against its torch form, the fused
quantize bit for bit against harness.rank.quant, and the whole push protocol on CPU stand-ins: P ranks' buffers,
signal pads and epochs as plain tensors of one process, each phase run for every rank in turn (what the flags
order on the GPU), with every slot traced to its sender. On CPU the Triton forms run in Triton's interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton reads it when first imported: nothing in the tests imports it earlier
    os.environ.setdefault("TRITON_INTERPRET", "1")

import harness.rank.comm.push as push
from harness.rank.comm.push import (
    COMBINED,
    CONSUMED,
    FLAG_BASE,
    NUM_PHASES,
    READY,
    Mapped,
    PushFormat,
    Slots,
)
from harness.rank.quant import quantize_per_token
from test_fused import device  # noqa: F401  (the interpreter on CPU, compiled on a GPU)

pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[test]' brings it)")


def _routing(n: int, G: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(G, generator=g)[:k] for _ in range(n)]) if n else torch.zeros((0, k))
    weights = torch.rand((n, k), generator=g) + 0.5
    return ids.to(torch.int64), weights / weights.sum(1, keepdim=True)


def _tokens(n: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, K), generator=g) * torch.exp(2 * torch.randn((n, 1), generator=g))
    if n > 2:
        x[1] = 0.0  # an all-zero row: the scale's clamp
        x[2, :5] = torch.tensor([448.0 * 3, -1e-30, 2.0**-140, 1e-8, -0.0])  # a max, subnormals, signed zero
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("n, E, P, k", [(300, 4, 3, 5), (257, 16, 1, 8), (1, 2, 2, 2)])
def test_route_layout_triton_equals_torch(device, n, E, P, k):
    ids, _ = _routing(n, E * P, k, seed=n)
    ref = push.route_layout_torch(ids, num_local_experts=E, num_ranks=P)
    pos = torch.full((n, k), -7, dtype=torch.int32, device=device)
    row_index = torch.full((n, P), -7, dtype=torch.int32, device=device)
    counts = torch.full((E * P + P,), -7, dtype=torch.int32, device=device)
    push.route_layout(ids.to(device), pos, row_index, counts, num_local_experts=E, num_ranks=P, impl="triton")
    assert torch.equal(pos.cpu(), ref[0]) and torch.equal(row_index.cpu(), ref[1]) and torch.equal(counts.cpu(), ref[2])
    # What the layout means: the j-th pair for expert g in token order has position j; rows count tokens per rank
    for g in range(E * P):
        t, j = torch.nonzero(ids == g, as_tuple=True)
        assert ref[0][t, j].tolist() == list(range(t.numel()))
    assert ref[2][E * P :].tolist() == [int(((ids // E) == d).any(1).sum()) for d in range(P)]


def _slots(E: int, M: int, P: int, C: int, fmt: PushFormat, device) -> Slots:
    K, k = fmt.hidden_size, fmt.top_k
    return Slots(
        x=torch.zeros((E * M, K), dtype=torch.uint8, device=device),
        scale=torch.zeros(E * M, dtype=torch.float32, device=device),
        src=torch.full((E * M, 2), -1, dtype=torch.int32, device=device),
        table=torch.full((P * C, k), -5, dtype=torch.int64, device=device),
        table_w=torch.full((P * C, k), -5.0, dtype=torch.float32, device=device),
        tok=torch.full((P * C,), -5, dtype=torch.int32, device=device),
        max_slots=M,
    )


@pytest.mark.parametrize("K", [7168, 96])
def test_fused_quantize_is_bit_equal_to_the_torch_quantize(device, K):
    """Rank 1 of 2: its rows to rank 0 go into rank 0's receive buffer, its own pairs into its slots."""
    n, E, P, k, me = 9, 2, 2, 3, 1
    M = n
    x = _tokens(n, K, seed=K)
    ids, weights = _routing(n, E * P, k, seed=1)
    fmt = PushFormat(hidden_size=K, top_k=k)
    pos, row_index, _counts = push.route_layout_torch(ids, num_local_experts=E, num_ranks=P)
    out, own = {}, {}
    for impl in ("triton", "torch"):
        bufs = [torch.full(((P - 1) * n, fmt.row_bytes), 0xAB, dtype=torch.uint8, device=device) for _ in range(P)]
        slots = _slots(E, M, P, n, fmt, device)
        push.quantize_push(
            x.to(device),
            None,
            ids.to(device),
            weights.to(device),
            pos.to(device),
            row_index.to(device),
            Mapped.of(bufs, device),
            slots,
            fmt=fmt,
            rank=me,
            capacity=n,
            num_local_experts=E,
            impl=impl,
        )
        out[impl] = [b.cpu() for b in bufs]
        own[impl] = {f: getattr(slots, f).cpu() for f in ("x", "scale", "src", "table", "table_w", "tok")}
    q, scale = (t.cpu() for t in quantize_per_token(x.to(device)))  # torch's quantize on the same device
    for impl in ("triton", "torch"):
        assert push.recv_region(me, 0, P) == 0
        rows = out[impl][0]  # rank 1's rows on rank 0: its only region
        for t in range(n):
            r = int(row_index[t, 0])
            if r < 0:
                continue
            assert torch.equal(rows[r, :K], q[t].view(torch.uint8)), (impl, t)
            words = rows[r, K : K + 4 * fmt.meta_words].view(torch.int32)
            assert words[0].view(torch.float32).item() == scale[t, 0].item()
            assert int(words[1]) == t
            assert words[2 : 2 + k].tolist() == [int(g) % E if int(g) // E == 0 else -1 for g in ids[t]]
        assert (out[impl][me] == 0xAB).all()  # nothing staged for this rank's own pairs
        o = own[impl]
        for t in range(n):  # this rank's own pairs: slot pos of its local expert, and its combine table row
            r = int(row_index[t, me])
            assert (r >= 0) == bool((ids[t] // E == me).any())
            if r < 0:
                continue
            assert int(o["tok"][me * n + r]) == t
            for j in range(k):
                g = int(ids[t, j])
                if g // E != me:
                    assert int(o["table"][me * n + r, j]) == 0 and o["table_w"][me * n + r, j].item() == 0.0
                    continue
                dst = (g % E) * M + int(pos[t, j])
                assert int(o["table"][me * n + r, j]) == dst
                assert o["table_w"][me * n + r, j].item() == weights[t, j].item()
                assert torch.equal(o["x"][dst], q[t].view(torch.uint8)), (impl, t, j)
                assert o["scale"][dst].item() == scale[t, 0].item()
                assert o["src"][dst].tolist() == [me, t]
        used = slice(0, K + 4 * fmt.meta_words)  # the padding after the words is not written by the Triton form
        assert torch.equal(out["triton"][0][:, used], out["torch"][0][:, used])
    for f in own["torch"]:
        assert torch.equal(own["triton"][f], own["torch"][f]), f


class StandIn:
    """One rank's buffers of the push path, as symm_mem.SymmMemComm allocates them, on one device."""

    def __init__(self, rank: int, *, P: int, E: int, M: int, C: int, fmt: PushFormat, device: torch.device):
        K, k = fmt.hidden_size, fmt.top_k
        self.rank = rank
        self.recv_rows = torch.full(((P - 1) * C, fmt.row_bytes), 0xCD, dtype=torch.uint8, device=device)
        self.recv_counts = torch.zeros((P, E + 1), dtype=torch.int32, device=device)
        self.combine_recv = torch.full((P * C, K), float("nan"), dtype=torch.bfloat16, device=device)
        self.pad = torch.zeros(FLAG_BASE + NUM_PHASES * P, dtype=torch.int32, device=device)
        self.pos = torch.zeros((C, k), dtype=torch.int32, device=device)
        self.row_index = torch.zeros((C, P), dtype=torch.int32, device=device)
        self.counts = torch.zeros(E * P + P, dtype=torch.int32, device=device)
        self.base = torch.zeros((P, E), dtype=torch.int32, device=device)
        self.x = torch.zeros((E * M, K), dtype=torch.uint8, device=device)
        self.x_scale = torch.zeros(E * M, dtype=torch.float32, device=device)
        self.x_src = torch.full((E * M, 2), -1, dtype=torch.int32, device=device)
        self.num_tokens = torch.zeros(E, dtype=torch.int32, device=device)
        self.overflow = torch.zeros(1, dtype=torch.int64, device=device)
        self.table = torch.zeros((P * C, k), dtype=torch.int64, device=device)
        self.table_w = torch.zeros((P * C, k), dtype=torch.float32, device=device)
        self.tok = torch.zeros(P * C, dtype=torch.int32, device=device)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self.done = torch.zeros(3, dtype=torch.int32, device=device)
        self.slots = Slots(
            x=self.x,
            scale=self.x_scale,
            src=self.x_src,
            table=self.table,
            table_w=self.table_w,
            tok=self.tok,
            max_slots=M,
        )


SPINS = 1 << 20  # a wait in the stand-in protocol never needs to poll: a missing flag fails fast in the status


def _protocol_round(ranks: list[StandIn], inputs, expert_out, *, E, M, C, fmt, impl, device, fused):
    """One dispatch + combine over the stand-ins: each phase for every rank, in the order the flags allow.
    fused: the waits and the READY and COMBINED signals run inside the kernels around them (as symm_mem runs
    them), else as kernels of their own."""
    P = len(ranks)
    rows = Mapped.of([r.recv_rows for r in ranks], device)
    counts = Mapped.of([r.recv_counts for r in ranks], device)
    pads = Mapped.of([r.pad for r in ranks], device)
    combine = Mapped.of([r.combine_recv for r in ranks], device)
    kw = {"impl": impl}

    def sig(r, phase, i, **extra):
        return push.Signal(pads=pads, phase=phase, rank=r.rank, epoch=r.epoch, done=r.done[i : i + 1], **extra)

    def signal(s):
        push.signal(
            s.pads,
            s.phase,
            rank=s.rank,
            epoch=s.epoch,
            counts=s.counts,
            recv_counts=s.recv_counts,
            num_local_experts=s.num_local_experts,
            **kw,
        )

    for r, (x, ids, w) in zip(ranks, inputs, strict=True):
        consumed = push.Wait(
            pad=r.pad, phase=CONSUMED, num_ranks=P, epoch=r.epoch, status=r.status, bump=True, lag=1, max_spins=SPINS
        )
        ready = sig(r, READY, 0, counts=r.counts, recv_counts=counts, num_local_experts=E)
        if not fused:
            push.wait(
                r.pad, CONSUMED, num_ranks=P, epoch=r.epoch, status=r.status, bump=True, lag=1, max_spins=SPINS, **kw
            )
        push.route_layout(
            ids,
            r.pos,
            r.row_index,
            r.counts,
            num_local_experts=E,
            num_ranks=P,
            wait_first=consumed if fused else None,
            **kw,
        )
        push.quantize_push(
            x,
            None,
            ids,
            w,
            r.pos,
            r.row_index,
            rows,
            r.slots,
            fmt=fmt,
            rank=r.rank,
            capacity=C,
            num_local_experts=E,
            then=ready if fused else None,
            **kw,
        )
        if not fused:
            signal(ready)
    for r in ranks:
        ready_wait = push.Wait(pad=r.pad, phase=READY, num_ranks=P, epoch=r.epoch, status=r.status, max_spins=SPINS)
        if not fused:
            push.wait(r.pad, READY, num_ranks=P, epoch=r.epoch, status=r.status, max_spins=SPINS, **kw)
        push.expert_base(
            r.recv_counts,
            r.base,
            r.num_tokens,
            r.overflow,
            rank=r.rank,
            max_slots=M,
            wait_first=ready_wait if fused else None,
            **kw,
        )
        push.expand(r.recv_rows, r.recv_counts, r.base, r.slots, rank=r.rank, fmt=fmt, **kw)
        signal(sig(r, CONSUMED, 1))  # a kernel of its own, as symm_mem issues it
    for r in ranks:
        push.reduce_push(
            expert_out[r.rank],
            r.recv_counts,
            r.table,
            r.table_w,
            r.tok,
            combine,
            rank=r.rank,
            then=sig(r, COMBINED, 2) if fused else None,
            **kw,
        )
        if not fused:
            signal(sig(r, COMBINED, 2))
    for r in ranks:  # every flag of this epoch, towards every rank, and the done counters back at 0
        for phase in (READY, CONSUMED, COMBINED):
            got = r.pad[FLAG_BASE + phase * P : FLAG_BASE + (phase + 1) * P].tolist()
            assert got == [int(r.epoch)] * P, (impl, fused, r.rank, phase, got)
        assert r.done.tolist() == [0, 0, 0], (impl, fused, r.rank)
    outs = []
    for r, (x, _, _) in zip(ranks, inputs, strict=True):
        push.wait(r.pad, COMBINED, num_ranks=P, epoch=r.epoch, status=r.status, max_spins=SPINS, **kw)
        out = torch.full((x.shape[0], fmt.hidden_size), float("nan"), dtype=torch.bfloat16, device=device)
        outs.append(push.token_reduce(r.combine_recv, r.row_index, out, **kw))
    return outs


@pytest.mark.parametrize("impl, fused", [("triton", True), ("triton", False), ("torch", True)])
def test_push_protocol_on_stand_ins_traces_every_slot_and_combines(device, impl, fused):
    P, E, k, K, C = 3, 2, 3, 64, 12
    M = 2 * C  # room for every source's pairs of one expert in the hot round below
    fmt = PushFormat(hidden_size=K, top_k=k)
    assert push.source_order(1, P) == [1, 2, 0]
    assert [push.recv_region(s, 1, P) for s in (2, 0)] == [0, 1]  # rank 1's regions: the others in its order
    ranks = [StandIn(r, P=P, E=E, M=M, C=C, fmt=fmt, device=device) for r in range(P)]
    # an idle rank, then a full one; then the last rank sends every token to every rank, so the last program of
    # expand and reduce_push (the last to run in the interpreter) has a row: its signal still names its flag
    for round_index, sizes in enumerate([(12, 5, 0), (3, 12, 7), (0, 5, 12)]):
        inputs = []
        for s, n in enumerate(sizes):
            ids, w = _routing(n, E * P, k, seed=10 * round_index + s)
            if round_index == 2 and s == P - 1:
                ids = torch.tensor([[d * E + t % E for d in range(P)] for t in range(n)], dtype=torch.int64)
            inputs.append((_tokens(n, K, seed=s).to(device), ids.to(device), w.to(device)))
        g = torch.Generator().manual_seed(round_index)
        expert_out = [torch.randn((E * M, K), generator=g).to(torch.bfloat16).to(device) for _ in range(P)]
        outs = _protocol_round(ranks, inputs, expert_out, E=E, M=M, C=C, fmt=fmt, impl=impl, device=device, fused=fused)
        for r in ranks:
            assert int(r.status) == 0 and int(r.epoch) == round_index + 1 and int(r.overflow) == 0
            for e in range(E):
                g_id = r.rank * E + e
                pairs = [
                    (s, t)
                    for s in push.source_order(r.rank, P)
                    for t in range(inputs[s][1].shape[0])
                    if (inputs[s][1][t] == g_id).any()
                ]
                assert int(r.num_tokens[e]) == len(pairs)
                # deterministic offsets: this rank's own pairs first, then the other sources in rank order after
                # it, tokens in order within a source
                got = [tuple(v) for v in r.x_src[e * M : e * M + len(pairs)].tolist()]
                assert got == pairs, (impl, r.rank, e)
                for slot, (s, t) in enumerate(pairs):
                    q, scale = (v.cpu() for v in quantize_per_token(inputs[s][0][t : t + 1]))  # on the device
                    assert torch.equal(r.x[e * M + slot].cpu(), q[0].view(torch.uint8))
                    assert r.x_scale[e * M + slot].item() == scale.item()
        for s, (x, ids, w) in enumerate(inputs):
            ref = torch.zeros((x.shape[0], K), dtype=torch.float64)
            for t in range(x.shape[0]):
                for j in range(k):
                    d, e = divmod(int(ids[t, j]), E)
                    rr = ranks[d]
                    slot = next(i for i in range(M) if tuple(rr.x_src[e * M + i].tolist()) == (s, t))
                    ref[t] += float(w[t, j]) * expert_out[d][e * M + slot].double().cpu()
            err = (outs[s].double().cpu() - ref).abs()
            # per rank a bf16 partial, then the bf16 sum of P of them: a few bf16 roundings of the magnitude
            assert (err <= 2.0**-6 * ref.abs() + 2.0**-6).all(), (impl, s, float(err.max()))


def test_wait_reports_a_missing_flag_instead_of_hanging(device):
    """A peer that never signalled: the wait gives up after its polls and names the peer in the status bits."""
    P = 3
    pad = torch.zeros(FLAG_BASE + NUM_PHASES * P, dtype=torch.int32, device=device)
    epoch = torch.tensor([4], dtype=torch.int32, device=device)
    pad[FLAG_BASE + READY * P : FLAG_BASE + READY * P + P] = torch.tensor([4, 3, 5], dtype=torch.int32)
    for impl in ("triton", "torch"):
        status = torch.zeros(1, dtype=torch.int32, device=device)
        push.wait(pad, READY, num_ranks=P, epoch=epoch, status=status, max_spins=3, impl=impl)
        assert int(status) == 0b010, impl  # peer 1 is an epoch behind
        status.zero_()
        push.wait(pad, READY, num_ranks=P, epoch=epoch, status=status, lag=1, max_spins=3, impl=impl)
        assert int(status) == 0, impl
    e = epoch.clone()
    push.wait(pad, CONSUMED, num_ranks=P, epoch=e, status=status, bump=True, lag=1, max_spins=2, impl="triton")
    assert int(e) == 5 and int(status) == 0b111  # nothing consumed epoch 4 yet
