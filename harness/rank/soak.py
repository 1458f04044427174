"""Soak: many dispatch + combine rounds through a rank's real comm backend, every round checked on the rank itself.

A fault that shows once in tens of runs (a race inside a collective, a slot written late) needs many rounds with
changing shapes to show again, and a check strong enough to see it. Each round every rank draws fresh tokens and
routing from (seed, round, source rank), so every rank can regenerate every other rank's inputs without
communicating, and the round's kind varies the counts: uniform, skewed (Zipf 2), hot (every token picks expert 0:
expert 0 of rank 0 fills to M), full (every rank at its capacity), idle (one rank sends nothing). Rounds follow
each other with no barrier, as a serving loop's layers do.

The expert of global id g multiplies its dequantized input by 1 + g / G (G experts in all), so the right answer
has a closed form and every term of a token weighs at least 1/12 of the token's sum (weights drawn in [0.5, 1.5]
before normalising, factors in [1, 2)). Per round the rank checks:

    counts    expert_num_tokens equals the pairs routed to each local expert, over every source rank
    slots     each valid slot names a (source rank, token) routed to that expert, each such pair exactly once,
              with the sender's FP8 bytes and scale
    partials  each row that came back for a token from rank p (the comm's combine_terms) against the closed form
              of the token's terms on rank p, within 2^-7 of the terms' magnitude (bf16 expert rows, then a bf16
              partial): a term lost or counted twice is at least 1/12 of it, so it cannot hide
    output    the combined token against the closed form of all its terms, within 3 * 2^-8 of their magnitude

A failed check is a SoakFault naming the round, its kind and the first wrong item; the rank's SoakRecord crosses
the process boundary (benchmarks/soak_comm.py runs it on 2 GPUs or on gloo ranks).

Graph mode (a backend that captures: symm-mem): every rank holds C tokens each round (a graph has fixed shapes),
fresh values and routing copied into static inputs before each replay; dispatch and combine are captured twice
(the expert step runs eagerly between their replays), rank r sleeping r x delay cycles on the GPU before each in
one pair and (P - 1 - r) x delay in the other, the pairs replayed in turn, so each rank is sometimes early and
sometimes late and only the flags keep the round ordered.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import torch

from harness.core.environment import collect_hardware, collect_versions
from harness.core.records import Hardware, RankHeader, Record, Versions
from harness.rank.combine import combine
from harness.rank.comm import DispatchHandle, DispatchLayout
from harness.rank.dispatch import dispatch
from harness.rank.lifecycle import RankSetup
from harness.rank.quant import dequantize
from harness.rank.route import Routing, route

RoundKind = Literal["uniform", "skewed", "hot", "full", "idle"]
ROUND_KINDS: tuple[RoundKind, ...] = ("uniform", "skewed", "hot", "full", "idle")
PARTIAL_TOLERANCE = 2.0**-7  # of the terms' magnitude: a bf16 expert row, then a bf16 partial sum
OUTPUT_TOLERANCE = 3 * 2.0**-8  # one more rounding: the bf16 combined output
MAX_FAULTS_KEPT = 20


class SoakFault(Record):
    round: int
    kind: RoundKind
    check: Literal["counts", "slots", "partials", "output"]
    detail: str


class SoakRecord(RankHeader):
    """One rank's soak: how many rounds and items it checked, and every fault (the first MAX_FAULTS_KEPT in full)."""

    versions: Versions
    hardware: Hardware
    comm: str
    row_kernels: str
    rounds: int
    rounds_failed: int
    slots_checked: int
    tokens_checked: int
    faults: list[SoakFault]
    faults_dropped: int
    wall_s: float
    mode: Literal["eager", "graph"] = "eager"
    delay_cycles: int = 0  # graph mode: the per-rank GPU sleep unit


def round_kind(round_index: int) -> RoundKind:
    return ROUND_KINDS[round_index % len(ROUND_KINDS)]


def round_inputs(
    layout: DispatchLayout, *, seed: int, round_index: int, src: int, full: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank `src`'s tokens (n, K) bf16, topk_ids (n, top_k) int64 and topk_weights (n, top_k) float32 in round
    `round_index`, on CPU; the same on every rank. `full`: n = C whatever the kind (graph mode)."""
    L, kind = layout, round_kind(round_index)
    G, k, C = L.num_ranks * L.num_local_experts, L.top_k, L.buffer_tokens
    g = torch.Generator().manual_seed((seed * 1_000_003 + round_index) * 4099 + src)
    if kind == "full" or full:
        n = C
    elif kind == "idle" and src == round_index % L.num_ranks:
        n = 0
    else:
        n = int(torch.randint(0, C + 1, (1,), generator=g))
    ids = route(
        kind={"hot": "worst-case"}.get(kind, "skewed" if kind == "skewed" else "uniform"),
        num_tokens=n,
        num_experts=G,
        top_k=k,
        seed=int(torch.randint(0, 2**31, (1,), generator=g)),
        zipf_exponent=2.0,
    ).topk_ids
    weights = torch.rand((n, k), generator=g) + 0.5
    weights /= weights.sum(1, keepdim=True)
    tokens = torch.randn((n, L.hidden_size), generator=g) * torch.exp(torch.randn((n, 1), generator=g))
    return tokens.to(torch.bfloat16), ids, weights


def expert_factors(layout: DispatchLayout, device: torch.device) -> torch.Tensor:
    """(E,) float32: this rank's expert e scales its input by 1 + (rank * E + e) / G."""
    E, G = layout.num_local_experts, layout.num_ranks * layout.num_local_experts
    return 1.0 + (layout.rank * E + torch.arange(E, device=device, dtype=torch.float32)) / G


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.reshape(-1))[0, 0])


Inputs = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per rank: tokens, topk_ids, topk_weights


def check_round(
    setup: RankSetup, round_index: int, sources: Inputs, handle: DispatchHandle, combined: torch.Tensor
) -> tuple[list[SoakFault], int]:
    """The round's four checks on this rank (module docstring); returns the faults and the slots checked.
    sources[s] = (tokens, topk_ids, topk_weights) of rank s on this rank's device."""
    L, comm, device, kind = setup.layout, setup.buffers, setup.device, round_kind(round_index)
    E, M, P, C, K = L.num_local_experts, L.max_slots_per_expert, L.num_ranks, L.buffer_tokens, L.hidden_size
    G, rank = P * E, L.rank
    faults: list[SoakFault] = []

    def fault(check: Literal["counts", "slots", "partials", "output"], detail: str) -> None:
        faults.append(SoakFault(round=round_index, kind=kind, check=check, detail=detail))

    quantized = [setup.quantize(tokens) for tokens, _, _ in sources]
    # counts and slots: (expert, source rank, token) triples, as routed and as found in the batched buffer
    routed = []
    for src_rank, (_, ids, _) in enumerate(sources):
        token, col = torch.nonzero(torch.div(ids, E, rounding_mode="floor") == rank, as_tuple=True)
        routed.append((ids[token, col] % E) * (P * C) + src_rank * C + token)
    want = torch.sort(torch.cat(routed)).values
    want_counts = torch.bincount(torch.div(want, P * C, rounding_mode="floor"), minlength=E)
    counts = comm.expert_num_tokens.to(torch.int64)
    if not torch.equal(counts, want_counts):
        e = _first(counts != want_counts)
        fault("counts", f"expert {e}: expert_num_tokens {int(counts[e])}, routed {int(want_counts[e])}")
    slots = 0
    if not faults:
        valid = torch.arange(M, device=device).unsqueeze(0) < counts.unsqueeze(1)  # (E, M)
        expert, slot = torch.nonzero(valid, as_tuple=True)
        src = comm.expert_src[expert, slot].to(torch.int64)  # (source rank, token)
        named = (src[:, 0] >= 0) & (src[:, 0] < P) & (src[:, 1] >= 0) & (src[:, 1] < C)
        got = torch.where(named, expert * (P * C) + src[:, 0] * C + src[:, 1], -1)
        order = torch.argsort(got)
        if not torch.equal(got[order], want):
            i = _first(got[order] != want)
            j = int(order[i])
            fault(
                "slots",
                f"expert {int(expert[j])} slot {int(slot[j])} names (source rank, token) "
                f"{tuple(int(v) for v in src[j])}, not a routed pair held once",
            )
        else:
            q_all = torch.zeros((P * C, K), dtype=torch.uint8, device=device)
            s_all = torch.zeros(P * C, dtype=torch.float32, device=device)
            for s, (q, scale) in enumerate(quantized):
                q_all[s * C : s * C + q.shape[0]] = q.view(torch.uint8)
                s_all[s * C : s * C + q.shape[0]] = scale.reshape(-1)
            key = src[:, 0] * C + src[:, 1]
            rows_ok = (comm.expert_x.view(torch.uint8)[expert, slot] == q_all.index_select(0, key)).all(1)
            ok = rows_ok & (comm.expert_x_scale.reshape(E, M)[expert, slot] == s_all.index_select(0, key))
            if not bool(ok.all()):
                j = _first(~ok)
                fault(
                    "slots",
                    f"expert {int(expert[j])} slot {int(slot[j])} ({tuple(int(v) for v in src[j])}): "
                    f"{'scale' if bool(rows_ok[j]) else 'FP8 row'} differs from the sender's",
                )
        slots = int(valid.sum())
    # partials and output: the closed form of each of this rank's tokens
    _tokens, ids, weights = sources[rank]
    n = ids.shape[0]
    if n:
        q, scale = quantized[rank]
        x = dequantize(q, scale)  # (n, K)
        term = weights * (1.0 + ids.float() / G)  # (n, k)
        per_rank = torch.zeros((n, P), dtype=torch.float32, device=device)
        per_rank.scatter_add_(1, torch.div(ids, E, rounding_mode="floor"), term)
        rows, row_weights = comm.combine_terms(handle)
        got = rows.float().view(n, P, K) * row_weights.view(n, P, 1)
        want_rows = x.unsqueeze(1) * per_rank.unsqueeze(2)
        err = (got - want_rows).abs() - PARTIAL_TOLERANCE * want_rows.abs()
        if bool((err > 0).any()) or not bool(torch.isfinite(got).all()):
            t, p, c = (int(v) for v in torch.nonzero((err > 0) | ~torch.isfinite(got))[0])
            fault(
                "partials",
                f"token {t}'s row from rank {p}: element {c} is {float(got[t, p, c]):.6g}, closed "
                f"form {float(want_rows[t, p, c]):.6g}; row max |got| {float(got[t, p].abs().max()):.6g}, "
                f"|closed form| {float(want_rows[t, p].abs().max()):.6g}",
            )
        want_out = x * per_rank.sum(1, keepdim=True)
        out_err = (combined.float() - want_out).abs() - OUTPUT_TOLERANCE * want_out.abs()
        if bool((out_err > 0).any()) or not bool(torch.isfinite(combined.float()).all()):
            t, c = (int(v) for v in torch.nonzero((out_err > 0) | ~torch.isfinite(combined.float()))[0])
            fault(
                "output",
                f"token {t} element {c} is {float(combined[t, c]):.6g}, closed form {float(want_out[t, c]):.6g}",
            )
    return faults, slots


def run_round(
    setup: RankSetup, round_index: int, *, seed: int, factors: torch.Tensor | None = None
) -> tuple[Inputs, DispatchHandle, torch.Tensor]:
    """One unchecked round: every rank's inputs (on this device), the dispatch handle and the combined output."""
    L, device, comm = setup.layout, setup.device, setup.buffers
    factors = expert_factors(L, device) if factors is None else factors
    sources: Inputs = []
    for s in range(L.num_ranks):
        tokens, ids, weights = round_inputs(L, seed=seed, round_index=round_index, src=s)
        sources.append((tokens.to(device), ids.to(device), weights.to(device)))
    tokens, ids, weights = sources[L.rank]
    handle = dispatch(tokens, Routing(topk_ids=ids, topk_weights=weights), L, comm, setup.quantize)
    expert_out = dequantize(comm.expert_x.float(), comm.expert_x_scale) * factors.view(-1, 1, 1)
    combined = combine(expert_out.to(torch.bfloat16), handle, L, comm)
    return sources, handle, combined


class GraphRounds:
    """Graph mode (module docstring): static inputs; two captured (dispatch, combine) pairs with opposite per-rank
    delays, replayed in turn; the expert step runs eagerly between them, as in the bench. The graphs hold the
    comm calls and the sleeps alone: on one H200 a torch op captured after dispatch's Triton kernels in the same
    graph did not take effect at replay (the expert outputs stayed as the eager pass left them), not understood
    yet, so nothing here depends on one."""

    def __init__(self, setup: RankSetup, *, delay_cycles: int):
        L, device, comm = setup.layout, setup.device, setup.buffers
        C, K, k, P, r = L.buffer_tokens, L.hidden_size, L.top_k, L.num_ranks, L.rank
        self.setup = setup
        self.tokens = torch.zeros((C, K), dtype=torch.bfloat16, device=device)
        self.ids = torch.zeros((C, k), dtype=torch.int64, device=device)
        self.ids.copy_(torch.arange(C * k, device=device).view(C, k) % (P * L.num_local_experts))
        self.weights = torch.full((C, k), 1.0 / k, dtype=torch.float32, device=device)
        self.expert_out = torch.zeros_like(comm.expert_x, dtype=torch.bfloat16)
        self.factors = expert_factors(L, device).view(-1, 1, 1)
        routing = Routing(topk_ids=self.ids, topk_weights=self.weights)
        held: dict[str, Any] = {}

        def first(cycles: int) -> None:
            if cycles:
                torch.cuda._sleep(cycles)
            held["handle"] = dispatch(self.tokens, routing, L, comm, setup.quantize)

        def second(cycles: int) -> None:
            if cycles:
                torch.cuda._sleep(cycles)
            held["out"] = combine(self.expert_out, held["handle"], L, comm)  # a view of a fixed buffer

        first(0)
        second(0)  # eager once: kernels built before capture
        torch.cuda.synchronize(device)
        self.pairs = []
        for cycles in (r * delay_cycles, (P - 1 - r) * delay_cycles):
            pair = []
            for fn in (first, second):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn(cycles)
                pair.append(graph)
            self.pairs.append(pair)
        # Each pair replayed once before any checked round, as capture_round does: on one H200 the first replay of
        # a captured nccl round in a process delivered zero partials (every later replay was right)
        for dispatch_graph, combine_graph in self.pairs:
            dispatch_graph.replay()
            combine_graph.replay()
        torch.cuda.synchronize(device)
        self.handle, self.out = held["handle"], held["out"]

    def run(self, round_index: int, *, seed: int) -> tuple[Inputs, DispatchHandle, torch.Tensor]:
        L, device, comm = self.setup.layout, self.setup.device, self.setup.buffers
        sources: Inputs = []
        for s in range(L.num_ranks):
            tokens, ids, weights = round_inputs(L, seed=seed, round_index=round_index, src=s, full=True)
            sources.append((tokens.to(device), ids.to(device), weights.to(device)))
        tokens, ids, weights = sources[L.rank]
        self.tokens.copy_(tokens)
        self.ids.copy_(ids)
        self.weights.copy_(weights)
        dispatch_graph, combine_graph = self.pairs[round_index % 2]
        dispatch_graph.replay()
        self.expert_out.copy_(
            (dequantize(comm.expert_x.float(), comm.expert_x_scale) * self.factors).to(torch.bfloat16)
        )
        combine_graph.replay()
        return sources, self.handle, self.out


def soak(
    setup: RankSetup, *, rounds: int, seed: int, run_id: str | None = None, graph: bool = False, delay_cycles: int = 0
) -> SoakRecord:
    """`rounds` dispatch + combine rounds through setup's comm, each checked (check_round); `graph`: replayed
    from CUDA graphs with per-rank delays (GraphRounds)."""
    L, device, comm = setup.layout, setup.device, setup.buffers
    if graph and not (device.type == "cuda" and comm.graph_capturable):
        raise ValueError(f"graph mode needs a comm backend that captures on a GPU, not {comm.name} on {device.type}")
    factors = expert_factors(L, device)
    replays = GraphRounds(setup, delay_cycles=delay_cycles) if graph else None
    faults: list[SoakFault] = []
    failed = slots = tokens_checked = 0
    start = time.perf_counter()
    for i in range(rounds):
        if replays is not None:
            sources, handle, combined = replays.run(i, seed=seed)
        else:
            sources, handle, combined = run_round(setup, i, seed=seed, factors=factors)
        found, checked = check_round(setup, i, sources, handle, combined)
        slots += checked
        tokens_checked += int(sources[L.rank][1].shape[0])
        failed += bool(found)
        faults.extend(found)
    wall = time.perf_counter() - start
    return SoakRecord(
        run_id=run_id or uuid.uuid4().hex[:12],
        scenario_hash=setup.scenario.scenario_hash,
        rank=L.rank,
        versions=collect_versions(),
        hardware=collect_hardware(device),
        comm=comm.name,
        row_kernels=setup.comm_record.row_kernels,
        rounds=rounds,
        rounds_failed=failed,
        slots_checked=slots,
        tokens_checked=tokens_checked,
        faults=faults[:MAX_FAULTS_KEPT],
        faults_dropped=max(0, len(faults) - MAX_FAULTS_KEPT),
        wall_s=wall,
        mode="graph" if graph else "eager",
        delay_cycles=delay_cycles if graph else 0,
    )
