"""The correctness check inside every run: each stage of the data path against the reference applied to the
previous stage's *actual* output, so the first stage that diverges is isolated, then the combined output against
a single-process reference.

    stage       compares                                                               rows
    dispatch    expert slots hold the tokens routed here: keys, FP8 bytes and scales   every valid slot
    gemm1       mm1_out  vs dequant(expert_x) @ dequant(w1[e])^T                        sampled, every expert
    activation  act_out  vs silu(gate) * up of the actual mm1_out                       every valid row
    quant       dequant(quant_out, act_scale) vs the actual act_out                    every valid row
    gemm2       mm2_out and out vs dequant(quant_out) @ dequant(w2[e])^T                sampled, every expert
    combine     the rank's tokens vs the sum of the rows that came back (one per rank,     every token
                each that rank's weighted sum of the token's expert rows: comm.combine_terms)
    output      the rank's tokens vs a reference that regenerates the experts          sampled tokens

Rows are global rows of the batched (E*M) view (row = e * M + slot) and "valid" means slot < expert_num_tokens[e];
combine's rows are this rank's tokens. Sampled rows are spread evenly over each expert's valid rows and include
its first and last. The workspace views overlap, so the backends call the hooks (harness.rank.experts.base.
StageHooks) at the moments two views coexist; the timed iterations run without hooks. harness.rank.lifecycle runs
one checked pass per policy with a `CheckedPass` (after_dispatch, the hooks, after_combine, then `correctness`),
which hands the comparisons to a `StageChecker`.

Every comparison runs on the device in chunks of at most CHECK_CHUNK_BYTES of float32 temporaries. Per-stage
statistics (wrong rows, first wrong row, largest error, wrong rows per expert) accumulate on the device and are
read back once at the end: the check synchronises a handful of times per policy, never per row or per slot.

A row's error is max |got - ref| / max |ref| over the row; it is wrong when that exceeds the stage's tolerance
(scenario `expect.stage_tolerance`) or is not finite.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harness.core.records import STAGES, Correctness, StageCheck
from harness.rank.comm import Comm
from harness.rank.dispatch import DispatchHandle, DispatchLayout
from harness.rank.experts.base import ExpertsBackend, ExpertWeights, Workspace, generate_expert
from harness.rank.experts.reference import expert_forward, silu_and_mul
from harness.rank.quant import dequantize, quantize_per_channel, quantize_per_token
from harness.rank.route import Routing
from harness.scenario.schema import Scenario

CHECK_CHUNK_BYTES = 256 * 2**20  # float32 temporaries of one comparison, at most
GEMM_ROWS_PER_EXPERT = 16  # sampled rows per expert for the GEMM stages, first and last valid row included
MAX_CHECKED_TOKENS = 64  # tokens of the end-to-end comparison (the reference regenerates every expert they use)
_NO_ROW = torch.iinfo(torch.int64).max
_HUGE = torch.finfo(torch.float32).max  # stands for a non-finite error in the records


def row_errors(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """(rows,) float32: max |got - ref| / max |ref| per row (or / `scale` per row). NaN stays NaN (wrong).

    A row whose reference is not finite gets -1: the stage's own input was not finite there, which an earlier
    stage's divergence explains; such rows are counted as not judged rather than wrong.
    """
    diff = (got.float() - ref).abs().amax(dim=1)
    denom = ref.abs().amax(dim=1) if scale is None else scale
    errors = diff / denom.clamp_min(torch.finfo(torch.float32).tiny)
    return torch.where(torch.isfinite(ref).all(dim=1), errors, -1.0)


def _rows_per_chunk(floats_per_row: int) -> int:
    return max(1, CHECK_CHUNK_BYTES // (4 * max(1, floats_per_row)))


class _Timer:
    """Wall time of the check's own work: the device is synchronised on entry and exit of each timed block."""

    def __init__(self, device: torch.device):
        self.device = device
        self.total_s = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> _Timer:
        self._sync()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.total_s += time.perf_counter() - self._t0


class _StageStats:
    """Running statistics of one stage, kept on the device."""

    def __init__(self, stage: str, rows: str, tolerance: float, num_experts: int, device: torch.device):
        self.stage, self.rows, self.tolerance = stage, rows, tolerance
        self.num_checked = 0  # known on the host: the row counts come from expert_num_tokens
        self.num_wrong = torch.zeros((), dtype=torch.int64, device=device)
        self.first_row = torch.full((), _NO_ROW, dtype=torch.int64, device=device)
        self.max_error = torch.zeros((), dtype=torch.float32, device=device)
        self.wrong_per_expert = torch.zeros(max(1, num_experts), dtype=torch.int64, device=device)
        self.num_unjudged = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, rows: torch.Tensor, errors: torch.Tensor, expert: int | torch.Tensor | None) -> None:
        """rows (n,) int64 global row ids, errors (n,) float32; `expert` the local expert of all rows, or (n,)."""
        if rows.numel() == 0:
            return
        self.num_checked += rows.numel()
        self.num_unjudged += (errors < 0).sum()
        wrong = ~(errors <= self.tolerance)  # NaN and inf are wrong
        self.num_wrong += wrong.sum()
        self.first_row = torch.minimum(self.first_row, torch.where(wrong, rows, _NO_ROW).min())
        finite = torch.nan_to_num(errors, nan=_HUGE, posinf=_HUGE)  # records hold finite floats (report.json is JSON)
        self.max_error = torch.maximum(self.max_error, finite.max())
        if isinstance(expert, int):
            self.wrong_per_expert[expert] += wrong.sum()
        elif expert is not None:
            self.wrong_per_expert.index_add_(0, expert, wrong.to(torch.int64))

    def packed(self) -> torch.Tensor:
        """num_wrong, first_row (-1: none), max_error, num_unjudged, wrong rows per expert: one float64 vector."""
        first = torch.where(self.first_row == _NO_ROW, torch.full_like(self.first_row, -1), self.first_row)
        head = torch.stack(
            [self.num_wrong.double(), first.double(), self.max_error.double(), self.num_unjudged.double()]
        )
        return torch.cat([head, self.wrong_per_expert.double()])


@dataclass(frozen=True, kw_only=True)
class ExpertsInput:
    """The experts step's input as dispatch left it: what GEMM1's reference reads."""

    expert_x: torch.Tensor  # (E, M, K) fp8
    expert_x_scale: torch.Tensor  # (E, M, 1) float32
    counts: list[int]  # expert_num_tokens, on the host (read once)
    weights: ExpertWeights


class StageChecker:
    """The correctness hooks (StageHooks) and the dispatch and combine comparisons of one checked iteration."""

    def __init__(self, inputs: ExpertsInput, *, scenario: Scenario, device: torch.device):
        self.inputs, self.device = inputs, device
        E = len(inputs.counts)
        M = inputs.expert_x.shape[1]
        self.E, self.M = E, M
        tol = scenario.expect.stage_tolerance
        kinds = {
            "dispatch": "all",
            "gemm1": "sampled",
            "activation": "all",
            "quant": "all",
            "gemm2": "sampled",
            "combine": "all",
        }
        self.stats = {s: _StageStats(s, kinds[s], getattr(tol, s), E, device) for s in STAGES}
        self.timer = _Timer(device)
        self.spans = [(e, e * M, e * M + n) for e, n in enumerate(inputs.counts) if n]
        self.samples = {e: self._sample(e, n) for e, _, _ in self.spans for n in [inputs.counts[e]]}
        self._gemm2: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # expert -> (ref, mm2_out errors)

    def _sample(self, expert: int, count: int) -> torch.Tensor:
        """Slots of `expert` the GEMM stages check: evenly spread, first and last valid slot included."""
        num = min(count, GEMM_ROWS_PER_EXPERT)
        slots = sorted({round(i * (count - 1) / max(1, num - 1)) for i in range(num)})
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def _valid_chunks(self, floats_per_row: int):
        """(expert, first row, end row) chunks over every valid row, each within CHECK_CHUNK_BYTES."""
        step = _rows_per_chunk(floats_per_row)
        for e, lo, hi in self.spans:
            for r0 in range(lo, hi, step):
                yield e, r0, min(hi, r0 + step)

    def _rows(self, lo: int, hi: int) -> torch.Tensor:
        return torch.arange(lo, hi, dtype=torch.int64, device=self.device)

    # -- dispatch -------------------------------------------------------------------------------------------

    def check_dispatch(
        self, expert_src: torch.Tensor, sources: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], rank: int
    ) -> None:
        """Every valid slot holds a (source rank, token) routed to that expert, once, with the sender's FP8 bytes
        and scale; every routed (token, expert) pair has a slot.

        expert_src (E, M, 2) int32 (source rank, source token); sources[src] = (topk_ids (n, top_k) int64 over the
        P*E experts, q (n, K) fp8, scale (n, 1) float32) as rank `src` quantized them.
        """
        with self.timer:
            self._check_dispatch(expert_src, sources, rank)

    def _check_dispatch(
        self, expert_src: torch.Tensor, sources: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], rank: int
    ) -> None:
        stats, E, M, dev = self.stats["dispatch"], self.E, self.M, self.device
        stride = max(1, max(ids.shape[0] for ids, _, _ in sources))  # key = src * stride + token
        ids_all = torch.full((len(sources) * stride, sources[0][0].shape[1]), -1, dtype=torch.int64, device=dev)
        q_all = torch.zeros((len(sources) * stride, self.inputs.expert_x.shape[2]), dtype=torch.uint8, device=dev)
        s_all = torch.zeros((len(sources) * stride,), dtype=torch.float32, device=dev)
        expected = torch.zeros(E, dtype=torch.int64, device=dev)
        for src_rank, (ids, q, scale) in enumerate(sources):
            n = ids.shape[0]
            ids_all[src_rank * stride : src_rank * stride + n] = ids.to(dev)
            q_all[src_rank * stride : src_rank * stride + n] = q.view(torch.uint8)
            s_all[src_rank * stride : src_rank * stride + n] = scale.reshape(-1)
            mine = ids[torch.div(ids, E, rounding_mode="floor") == rank]
            expected += torch.bincount(torch.remainder(mine, E).reshape(-1).to(dev), minlength=E)
        got_x = self.inputs.expert_x.view(torch.uint8)
        got_s = self.inputs.expert_x_scale.reshape(E, M)
        step = _rows_per_chunk(self.inputs.expert_x.shape[2])
        for e, lo, hi in self.spans:
            n = hi - lo
            src = expert_src[e, :n].to(torch.int64)
            key = src[:, 0] * stride + src[:, 1]
            in_range = (src[:, 0] >= 0) & (src[:, 0] < len(sources)) & (src[:, 1] >= 0) & (src[:, 1] < stride)
            key = torch.where(in_range, key, torch.zeros_like(key))
            routed = (ids_all.index_select(0, key) == rank * E + e).any(dim=1) & in_range
            ordered, order = torch.sort(key, stable=True)  # a key twice in one expert: its later slots are wrong
            duplicate = torch.zeros(n, dtype=torch.bool, device=dev)
            duplicate[order[1:]] = ordered[1:] == ordered[:-1]
            same = torch.ones(n, dtype=torch.bool, device=dev)
            for j0 in range(0, n, step):
                j1 = min(n, j0 + step)
                k = key[j0:j1]
                same[j0:j1] = (got_x[e, j0:j1] == q_all.index_select(0, k)).all(dim=1) & (
                    got_s[e, j0:j1] == s_all.index_select(0, k)
                )
            ok = routed & same & ~duplicate
            stats.add(self._rows(lo, hi), torch.where(ok, 0.0, 1.0).to(torch.float32), e)  # 1: not the sent row
        # Routed pairs that found no slot: the first slot after the expert's last valid one is where they belong.
        counts = torch.tensor(self.inputs.counts, dtype=torch.int64, device=dev)
        missing = (expected - counts).clamp_min(0)
        experts = torch.arange(E, device=dev)
        stats.num_wrong += missing.sum()
        stats.wrong_per_expert += missing
        stats.max_error = torch.maximum(stats.max_error, (missing.sum() > 0).to(torch.float32))
        first_missing = torch.where(missing > 0, experts * M + counts, _NO_ROW).min()
        stats.first_row = torch.minimum(stats.first_row, first_missing)

    # -- the experts step (StageHooks) ----------------------------------------------------------------------

    def after_activation(self, workspace: Workspace) -> None:
        with self.timer:
            self._check_gemm1(workspace)
            self._check_activation(workspace)

    def after_quant(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        with self.timer:
            stats, ws = self.stats["quant"], workspace
            for e, lo, hi in self._valid_chunks(3 * ws.intermediate_size):
                got = dequantize(ws.quant_out[lo:hi], act_scale[lo:hi])
                stats.add(self._rows(lo, hi), row_errors(got, ws.act_out[lo:hi].float()), e)

    def after_gemm2(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        with self.timer:
            ws, w = workspace, self.inputs.weights
            for e, lo, _ in self.spans:
                rows = lo + self.samples[e]
                x = dequantize(ws.quant_out.index_select(0, rows), act_scale.index_select(0, rows))
                ref = self._matmul_rows(x, w.w2[e], w.w2_scale[e])
                self._gemm2[e] = (ref, row_errors(ws.mm2_out.index_select(0, rows), ref))

    def after_out(self, workspace: Workspace) -> None:
        """out (what combine sends) must hold GEMM2's rows: judged with mm2_out against the same reference."""
        with self.timer:
            out = workspace.out.reshape(self.E * self.M, workspace.hidden_size)
            for e, lo, _ in self.spans:
                rows = lo + self.samples[e]
                ref, mm2_errors = self._gemm2.pop(e)
                errors = torch.maximum(mm2_errors, row_errors(out.index_select(0, rows), ref))  # NaN stays NaN
                self.stats["gemm2"].add(rows, errors, e)

    def _check_gemm1(self, ws: Workspace) -> None:
        x_all, s_all, w = self.inputs.expert_x, self.inputs.expert_x_scale, self.inputs.weights
        for e, lo, _ in self.spans:
            slots = self.samples[e]
            x = dequantize(x_all[e].index_select(0, slots), s_all[e].index_select(0, slots))
            ref = self._matmul_rows(x, w.w1[e], w.w1_scale[e])
            rows = lo + slots
            self.stats["gemm1"].add(rows, row_errors(ws.mm1_out.index_select(0, rows), ref), e)

    def _check_activation(self, ws: Workspace) -> None:
        stats = self.stats["activation"]
        for e, lo, hi in self._valid_chunks(6 * ws.intermediate_size):
            ref = silu_and_mul(ws.mm1_out[lo:hi])
            stats.add(self._rows(lo, hi), row_errors(ws.act_out[lo:hi], ref), e)

    def _matmul_rows(self, x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        """x (S, in) float32 @ dequant(w (out, in) fp8, w_scale (out,))^T in float32, over chunks of channels."""
        out_features, in_features = w.shape
        ref = torch.empty((x.shape[0], out_features), dtype=torch.float32, device=x.device)
        step = _rows_per_chunk(in_features)
        for n0 in range(0, out_features, step):
            n1 = min(out_features, n0 + step)
            ref[:, n0:n1] = x @ dequantize(w[n0:n1], w_scale[n0:n1].unsqueeze(1)).T
        return ref

    # -- combine --------------------------------------------------------------------------------------------

    def check_combine(self, combined: torch.Tensor, returned: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """combined (n, K) bf16 against sum_k w[t, k] * returned[t * W + k] in float32.

        returned (n * W, K) bf16: the rows that came back, W per token in token order; topk_weights (n, W)
        float32 (0 on padding). A row's error is relative to max over K of sum_k |w_k x_k| (no cancellation in it).
        """
        with self.timer:
            stats = self.stats["combine"]
            n, K = combined.shape
            if n == 0:
                return
            top_k = topk_weights.shape[1]
            step = _rows_per_chunk(3 * top_k * K)
            for t0 in range(0, n, step):
                t1 = min(n, t0 + step)
                terms = returned[t0 * top_k : t1 * top_k].float().view(t1 - t0, top_k, K)
                terms = terms * topk_weights[t0:t1].float().unsqueeze(-1)
                ref = terms.sum(dim=1)
                scale = terms.abs().sum(dim=1).amax(dim=1)
                del terms
                stats.add(self._rows(t0, t1), row_errors(combined[t0:t1], ref, scale), None)

    # -- results --------------------------------------------------------------------------------------------

    def results(self) -> list[StageCheck]:
        """Every stage's StageCheck, read back from the device in one transfer."""
        with self.timer:
            packed = torch.stack([self.stats[s].packed() for s in STAGES]).cpu().tolist()
        out = []
        for stage, values in zip(STAGES, packed, strict=True):
            stats = self.stats[stage]
            num_wrong, first, max_error, unjudged = int(values[0]), int(values[1]), float(values[2]), int(values[3])
            per_expert = values[4 : 4 + self.E]
            is_rows = stage != "combine"
            out.append(
                StageCheck(
                    stage=stage,  # type: ignore[arg-type]
                    rows=stats.rows,  # type: ignore[arg-type]
                    num_rows_checked=max(stats.num_checked, num_wrong),
                    num_rows_wrong=num_wrong,
                    num_rows_unjudged=unjudged,
                    max_rel_error=max_error,
                    tolerance=stats.tolerance,
                    first_wrong_row=first if first >= 0 else None,
                    first_wrong_expert=first // self.M if first >= 0 and is_rows else None,
                    first_wrong_slot=first % self.M if first >= 0 and is_rows else None,
                    wrong_experts=[e for e, c in enumerate(per_expert) if c > 0] if is_rows else [],
                )
            )
        return out


# ---------------------------------------------------------------------------------------------------------------
# The whole check of one policy


class CheckSetup(Protocol):
    """What the check reads from the rank's setup (harness.rank.lifecycle.RankSetup provides it, frozen)."""

    @property
    def scenario(self) -> Scenario: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def layout(self) -> DispatchLayout: ...

    @property
    def tokens(self) -> torch.Tensor: ...

    @property
    def routing(self) -> Routing: ...

    @property
    def weights(self) -> ExpertWeights: ...

    @property
    def buffers(self) -> Comm: ...

    @property
    def backend(self) -> ExpertsBackend: ...

    @property
    def quantize(self) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]: ...


SourceInputs = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # src rank -> (tokens (n, K) bf16, topk_ids)


class CheckedPass:
    """The hooks of one checked pass of the data path, then its Correctness.

    The rank's lifecycle runs dispatch -> experts -> combine as in a timed pass and calls `after_dispatch`, passes
    this object to the backend as its StageHooks, calls `after_combine`, and reads `correctness`. Every rank runs
    the checked pass together (dispatch and combine are collectives); the comparisons themselves are local.
    source_inputs(src) regenerates rank src's tokens and top-k ids from the seeds (the dispatch check compares
    each slot with what its sender quantized).
    """

    def __init__(self, setup: CheckSetup, source_inputs: SourceInputs):
        self.setup, self.source_inputs = setup, source_inputs
        self.checker: StageChecker | None = None

    def after_dispatch(self) -> None:
        """expert_x, its scales and expert_num_tokens are filled: read the counts once, check every slot."""
        setup, b = self.setup, self.setup.buffers
        counts = [int(c) for c in b.expert_num_tokens.tolist()]
        inputs = ExpertsInput(
            expert_x=b.expert_x, expert_x_scale=b.expert_x_scale, counts=counts, weights=setup.weights
        )
        checker = self.checker = StageChecker(inputs, scenario=setup.scenario, device=setup.device)
        with checker.timer:
            sources = []
            for src in range(setup.layout.num_ranks):
                tokens, ids = self.source_inputs(src)
                q, scale = setup.quantize(tokens.to(setup.device))  # the same kernel the sender used
                sources.append((ids.to(setup.device), q, scale))
        checker.check_dispatch(b.expert_src, sources, setup.layout.rank)
        checker.stats["dispatch"].num_wrong += b.batched.overflow  # slot indices past M, sunk instead of written

    def _checker(self) -> StageChecker:
        assert self.checker is not None, "after_dispatch comes first"
        return self.checker

    def after_activation(self, workspace: Workspace) -> None:
        self._checker().after_activation(workspace)

    def after_quant(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        self._checker().after_quant(workspace, act_scale)

    def after_gemm2(self, workspace: Workspace, act_scale: torch.Tensor) -> None:
        self._checker().after_gemm2(workspace, act_scale)

    def after_out(self, workspace: Workspace) -> None:
        self._checker().after_out(workspace)

    def after_combine(self, combined: torch.Tensor, handle: DispatchHandle) -> None:
        """combined (n, K): the rank's tokens, against the rows that came back for them (the comm backend's
        combine_terms: each rank's weighted partial sum of the token's expert rows)."""
        returned, weights = self.setup.buffers.combine_terms(handle)
        self._checker().check_combine(combined, returned, weights)

    def correctness(self, combined: torch.Tensor) -> Correctness:
        """Every stage's result (one read-back), the end-to-end error and the check's own time."""
        checker, s = self._checker(), self.setup.scenario
        stages = checker.results()
        with checker.timer:
            end_to_end = _end_to_end(self.setup, combined)
        return Correctness(
            max_abs_error=end_to_end["abs"],
            max_rel_error=end_to_end["rel"],
            num_wrong_slots=stages[0].num_rows_wrong,
            num_checked_tokens=end_to_end["num"],
            tolerance=s.expect.max_error,
            stages=stages,
            check_us=checker.timer.total_s * 1e6,
        )


def reference_output(setup: CheckSetup, token_index: torch.Tensor) -> torch.Tensor:
    """The MoE output of the chosen tokens in one process, float32: sum_k w_k * expert_k(x), experts regenerated.

    The same math as the batched path (FP8 tokens and weights, per-token FP8 activation), without the batched
    layout, the all-to-all or any workspace. Returns (len(token_index), K) float32.
    """
    s = setup.scenario
    K, I = setup.layout.hidden_size, s.model.intermediate_size or 0
    q, scale = quantize_per_token(setup.tokens.index_select(0, token_index))
    ids = setup.routing.topk_ids.index_select(0, token_index).cpu()
    w = setup.routing.topk_weights.index_select(0, token_index)
    out = torch.zeros((len(token_index), K), dtype=torch.float32, device=setup.device)
    for g in sorted(set(ids.reshape(-1).tolist())):
        rows, slots = torch.nonzero(ids == g, as_tuple=True)
        f1, f2 = generate_expert(seed=s.seed, global_expert=g, hidden_size=K, intermediate_size=I, device=setup.device)
        q1, s1 = quantize_per_channel(f1.unsqueeze(0))
        q2, s2 = quantize_per_channel(f2.unsqueeze(0))
        rows_d = rows.to(setup.device)
        y = expert_forward(q.index_select(0, rows_d), scale.index_select(0, rows_d), q1[0], s1[0], q2[0], s2[0])
        out.index_add_(0, rows_d, y * w[rows_d, slots.to(setup.device)].unsqueeze(1))
    return out


def _end_to_end(setup: CheckSetup, combined: torch.Tensor) -> dict[str, Any]:
    """The combined output of up to MAX_CHECKED_TOKENS evenly spread tokens against reference_output."""
    n = combined.shape[0]
    if n == 0:
        return {"abs": 0.0, "rel": 0.0, "num": 0}
    num = min(n, MAX_CHECKED_TOKENS)
    index = torch.linspace(0, n - 1, num, device=setup.device).round().to(torch.int64).unique()
    ref = reference_output(setup, index)
    got = combined.index_select(0, index).float()
    abs_err = float((got - ref).abs().max())
    rel_err = abs_err / max(float(ref.abs().max()), 1e-30)
    huge = float(_HUGE)  # records hold finite floats (report.json is JSON)
    return {
        "abs": abs_err if math.isfinite(abs_err) else huge,
        "rel": rel_err if math.isfinite(rel_err) else huge,
        "num": int(index.numel()),
    }
