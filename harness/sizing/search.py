"""`harness plan --search`: which EP/DP layout holds the most KV cache (or serves the most requests, or needs the
fewest GPUs) on a GPU, per release, with the exact `vllm serve` line of each.

Every candidate is planned by the same function as `harness plan -- vllm serve ...` (deployment_plan.plan_source)
on the serve line the search prints for it. What a release says is read once per search (ReleaseReads: its parsed
files, each source read, and one layer plan per distinct MoE layer); each candidate is then resolve() and the
deployment's arithmetic.

    searched (what the serve line leaves out)      values
    --tensor-parallel-size x --pipeline-parallel-size x --data-parallel-size
                                                   TP a power of two within a node (<= 8) dividing the GPUs and the
                                                   attention heads, PP 1, 2 or 4, DP the rest
    --enable-expert-parallel                       on and off (MoE models; one GPU: off)
    --all2all-backend                              the release's All2AllBackend values the layer model sizes
    --moe-backend                                  the release's own choice (moe_selection); --search-backends: each
    --max-num-batched-tokens                       the release's default, 256, 1024, 4096, 16384
    --enable-eplb --eplb-config                    0, EP and 2 x EP redundant experts (EP on)
    --kv-cache-dtype                               auto; fp8 too with --allow kv-fp8

A deployment's KV cache: each DP rank holds its own, and a DP rank's TP x PP GPUs share one (GQA splits its KV
heads over the TP GPUs, MLA's latent is replicated on every one; a stage holds its layers'), so the deployment
holds per-GPU tokens x DP.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import harness
from harness.core.records import Record
from harness.scenario.deployment import DeploymentSpec
from harness.scenario.schema import ScenarioError
from harness.sizing.deployment import GIB, DeploymentPlan
from harness.sizing.deployment_plan import ReleaseReads
from harness.sizing.model_config import ModelFacts
from harness.sizing.search_choices import Objective
from harness.sizing.serve_args import shell_line

SEARCH_SCHEMA = 1
# The all-to-all backends whose buffers the layer model reads from a release (harness.sizing.layer); a release's
# others are listed as offered and not searched.
SIZED_ALL2ALL = ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput")
SEARCH_BACKENDS = ("cutlass", "deep_gemm", "triton")
TOKEN_GRID = (256, 1024, 4096, 16384)
# Pipeline stages: each holds its share of the layers, their weights and their KV cache (no replication, unlike
# MLA's latent under TP); the ranking shows where that helps.
PP_OPTIONS = (1, 2, 4)
MAX_TP = 8  # TP within one node of 8 GPUs
MAX_GPUS = 4096
MAX_CANDIDATES = 200_000  # per release: about three minutes of CPU
# Layer plans kept: the candidates vary the MoE layer in their outer loops, so a layer's candidates come together and
# a small cache plans each once while the memory stays flat however many candidates there are.


class SearchError(Exception):
    """Bad search input: one line naming the field, the value and what is allowed."""


# --- the release, read once -----------------------------------------------------------------------------------------


def offered_all2all(reads: ReleaseReads) -> tuple[str, ...]:
    """The release's All2AllBackend values (config/parallel.py, read with ast); empty when it does not say."""
    import ast

    module = reads.files.module("vllm/config/parallel.py")
    for node in module.body if module is not None else []:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "All2AllBackend"
                                                for t in node.targets):  # fmt: skip
            return tuple(n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and
                         isinstance(n.value, str))  # fmt: skip
    return ()


# --- the candidates -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """One candidate: the serve flags the search sets (None: the release's default)."""

    gpus: int
    tp: int
    dp: int
    ep: bool
    all2all: str | None
    moe_backend: str | None
    max_num_batched_tokens: int | None
    num_redundant_experts: int | None
    kv_cache_dtype: str | None
    pp: int = 1

    @property
    def label(self) -> str:
        split = f"TP{self.tp} PP{self.pp} DP{self.dp}" if self.pp > 1 else f"TP{self.tp} DP{self.dp}"
        parts = [split, "EP" if self.ep else "no-EP"]
        if self.ep and self.all2all:
            parts.append(self.all2all)
        if self.moe_backend:
            parts.append(self.moe_backend)
        if self.max_num_batched_tokens:
            parts.append(f"T{self.max_num_batched_tokens}")
        if self.num_redundant_experts:
            parts.append(f"+{self.num_redundant_experts} redundant")
        if self.kv_cache_dtype:
            parts.append(f"kv {self.kv_cache_dtype}")
        return " ".join(parts)


@dataclass(frozen=True)
class SearchRequest:
    serve: tuple[str, ...]
    vllm_versions: tuple[str, ...]
    gpu: Any  # a GPU's name, or a row of harness.sizing.gpus
    total_bytes: int
    gpu_counts: tuple[int, ...]
    objective: Objective = "kv-tokens"
    min_concurrency: float | None = None
    allow: tuple[str, ...] = ()
    search_backends: bool = False
    top: int = 10
    cache_dir: Path | None = None


def given_flags(words: list[str]) -> set[str]:
    """The DeploymentSpec fields the serve line sets (by flag, its aliases and spellings included, as
    serve_args reads them; `--no-X` sets X too)."""
    from harness.sizing.serve_args import _BY_OPTION, _normalize

    given = set()
    for word in words:
        if not word.startswith("-"):
            continue
        option = _normalize(word)[0]
        base = "--" + option[5:] if option.startswith("--no-") else option
        modelled = _BY_OPTION.get(option) or _BY_OPTION.get(base)
        if modelled is not None:
            given.add(modelled.dest)
    if "eplb_config" in given:
        given.add("num_redundant_experts")
    return given


def gpu_counts_of(text: str) -> tuple[int, ...]:
    """`16` or `8,16,32`: SearchError naming the value otherwise."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 0 < int(part) <= MAX_GPUS:
            raise SearchError(f"--gpus {text[:40]!r}: {part[:20]!r} is not a GPU count; allowed: integers "
                              f"1..{MAX_GPUS}, comma-separated (e.g. 8,16,32)")  # fmt: skip
        counts.append(int(part))
    return tuple(dict.fromkeys(counts))


def tp_options(facts: ModelFacts, gpus: int) -> list[int]:
    """TP within a node: powers of two up to 8 that divide the GPUs and the attention heads (vLLM refuses others)."""
    return [tp for tp in (1, 2, 4, 8) if tp <= min(gpus, MAX_TP) and gpus % tp == 0 and
            facts.num_attention_heads % tp == 0]  # fmt: skip


def candidates(facts: ModelFacts, spec: DeploymentSpec, given: set[str], gpus: int, reads: ReleaseReads,
               request: SearchRequest, default_tokens: Callable[[bool], int]) -> Iterator[Layout]:  # fmt: skip
    """Every layout of `gpus` GPUs the serve line leaves open; `default_tokens(batched_dp)` is the release's
    max_num_batched_tokens default (a token value equal to it is the default, not a second candidate). TP x DP
    varies innermost: under EP the MoE layer is the same for every split of the GPUs, so its plan is reused."""
    from harness.sizing import release_defaults as defaults

    tps = [spec.tensor_parallel_size] if "tensor_parallel_size" in given else tp_options(facts, gpus)
    pps = [spec.pipeline_parallel_size] if "pipeline_parallel_size" in given else \
        [pp for pp in PP_OPTIONS if pp <= facts.num_hidden_layers]  # fmt: skip
    splits = [(tp, pp, gpus // (tp * pp)) for tp in tps for pp in pps if gpus % (tp * pp) == 0 and
              ("data_parallel_size" not in given or spec.data_parallel_size == gpus // (tp * pp))]  # fmt: skip
    eps = [bool(spec.enable_expert_parallel)] if "enable_expert_parallel" in given else \
        ([False, True] if facts.is_moe and gpus > 1 else [False])  # fmt: skip
    tokens: list[int | None] = [None] if "max_num_batched_tokens" in given else [None, *TOKEN_GRID]
    backends: list[str | None] = [None]
    if request.search_backends and "moe_backend" not in given and facts.is_moe:
        backends = [None, *SEARCH_BACKENDS]
    kv: list[str | None] = [None]
    if "kv-fp8" in request.allow and "kv_cache_dtype" not in given:
        kv = [None, "fp8"]
    for ep in eps:
        if "all2all_backend" in given or not ep:
            all2alls: list[str | None] = [None]
        else:
            offered = offered_all2all(reads) or SIZED_ALL2ALL
            all2alls = [a for a in SIZED_ALL2ALL if a in offered]
        redundant: list[int | None] = [None]
        if ep and facts.is_moe and "num_redundant_experts" not in given:
            redundant = [None, gpus, 2 * gpus]
        for all2all in all2alls:
            effective = all2all or spec.all2all_backend or "allgather_reducescatter"
            for t in tokens:
                for r in redundant:
                    for b in backends:
                        for tp, pp, dp in splits:
                            if dp == 1 and all2all not in (None, SIZED_ALL2ALL[0]):
                                continue  # vLLM runs no all-to-all kernels at DP 1 (use_all2all_kernels)
                            if t is not None and t == default_tokens(defaults.uses_batched_dp_moe(effective, ep, dp)):
                                continue  # the release's default: the candidate without the flag
                            for k in kv:
                                yield Layout(
                                    gpus=gpus,
                                    tp=tp,
                                    pp=pp,
                                    dp=dp,
                                    ep=ep,
                                    all2all=all2all,
                                    moe_backend=b,
                                    max_num_batched_tokens=t,
                                    num_redundant_experts=r,
                                    kv_cache_dtype=k,
                                )


def serve_words(words: list[str], layout: Layout, given: set[str]) -> list[str]:
    """The user's serve line with the layout's flags added (only flags the line left out)."""
    out = list(words)
    if out[:2] != ["vllm", "serve"]:
        out = ["vllm", "serve", *(out[1:] if out[:1] == ["serve"] else out)]
    if "tensor_parallel_size" not in given:
        out += ["--tensor-parallel-size", str(layout.tp)]
    if "pipeline_parallel_size" not in given and layout.pp > 1:
        out += ["--pipeline-parallel-size", str(layout.pp)]
    if "data_parallel_size" not in given:
        out += ["--data-parallel-size", str(layout.dp)]
    if layout.ep and "enable_expert_parallel" not in given:
        out.append("--enable-expert-parallel")
    if layout.all2all is not None:
        out += ["--all2all-backend", layout.all2all]
    if layout.moe_backend is not None:
        out += ["--moe-backend", layout.moe_backend]
    if layout.max_num_batched_tokens is not None:
        out += ["--max-num-batched-tokens", str(layout.max_num_batched_tokens)]
    if layout.num_redundant_experts is not None:
        if "enable_eplb" not in given:
            out.append("--enable-eplb")
        out += ["--eplb-config", json.dumps({"num_redundant_experts": layout.num_redundant_experts})]
    if layout.kv_cache_dtype is not None:
        out += ["--kv-cache-dtype", layout.kv_cache_dtype]
    return out


def spec_of(spec: DeploymentSpec, layout: Layout, given: set[str]) -> DeploymentSpec:
    """The DeploymentSpec serve_words' line reads as (checked against parse_serve for the lines shown)."""
    update: dict[str, object] = {}
    if "tensor_parallel_size" not in given:
        update["tensor_parallel_size"] = layout.tp
    if "pipeline_parallel_size" not in given:
        update["pipeline_parallel_size"] = layout.pp
    if "data_parallel_size" not in given:
        update["data_parallel_size"] = layout.dp
    if layout.ep and "enable_expert_parallel" not in given:
        update["enable_expert_parallel"] = True
    if layout.all2all is not None:
        update["all2all_backend"] = layout.all2all
    if layout.moe_backend is not None:
        update["moe_backend"] = layout.moe_backend
    if layout.max_num_batched_tokens is not None:
        update["max_num_batched_tokens"] = layout.max_num_batched_tokens
    if layout.num_redundant_experts is not None:
        update["enable_eplb"] = True
        update["num_redundant_experts"] = layout.num_redundant_experts
    if layout.kv_cache_dtype is not None:
        update["kv_cache_dtype"] = layout.kv_cache_dtype
    return DeploymentSpec.model_validate({**spec.model_dump(), **update})


# --- the records ----------------------------------------------------------------------------------------------------


class SearchCandidate(Record):
    """One layout of one release, as planned. Token counts are per GPU and across the deployment (x DP)."""

    vllm_version: str
    gpus: int
    tensor_parallel_size: int
    data_parallel_size: int
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool
    all2all_backend: str
    moe_backend: str
    moe_backend_source: str
    max_num_batched_tokens: int
    num_redundant_experts: int
    kv_cache_dtype: str
    label: str
    outcome: Literal["starts", "fails", "oom", "refused", "unknown"]
    verdict: str
    kv_bytes_per_token: int
    non_kv_bytes: int
    kv_cache_bytes: int
    per_gpu_kv_tokens: int
    deployment_kv_tokens: int
    per_gpu_concurrency: float
    deployment_concurrency: float
    meets_min_concurrency: bool | None = None
    rank: int | None = None  # 1 = best; None for a layout that does not start (or misses --min-concurrency)
    serve: list[str]

    @property
    def serve_line(self) -> str:
        return shell_line(self.serve)


class SearchRelease(Record):
    vllm_version: str
    candidates: int
    starting: int
    distinct_layers: int
    best: str | None  # the best candidate's label
    why: list[str]
    notes: list[str]


class SearchReport(Record):
    """`harness plan --search --json`: every candidate of every release, ranked."""

    schema_version: int = SEARCH_SCHEMA
    kind: Literal["layout-search"] = "layout-search"
    harness_version: str
    python_version: str
    input_hash: str  # sha256 of the search's input (serve line, releases, GPU, counts, objective, options)
    model: str
    gpu: str | None
    gpu_total_bytes: int
    gpu_counts: list[int]
    vllm_versions: list[str]
    objective: Objective
    min_concurrency: float | None
    allow: list[str]
    search_backends: bool
    serve: list[str]
    releases: list[SearchRelease]
    changes: list[str]
    candidates: list[SearchCandidate]


def gpu_name(request: SearchRequest) -> str | None:
    """The GPU's name: request.gpu is a name or a row of harness.sizing.gpus (--gpu-memory-gib gives one)."""
    from harness.sizing import gpus

    return gpus.label(request.gpu)


def input_hash(request: SearchRequest) -> str:
    data = {"serve": list(request.serve), "vllm_versions": list(request.vllm_versions), "gpu": gpu_name(request),
            "total_bytes": request.total_bytes, "gpu_counts": list(request.gpu_counts),
            "objective": request.objective, "min_concurrency": request.min_concurrency,
            "allow": sorted(request.allow), "search_backends": request.search_backends}  # fmt: skip
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def candidate_of(plan: DeploymentPlan, layout: Layout, serve: list[str], version: str) -> SearchCandidate:
    """A layout's plan as the search ranks it: by the startup it can count on, the fewest KV tokens of the plan's
    own and its other outcomes (DeploymentPlan.other_outcomes), and not starting where one of them does not."""
    s = {x.name: x for x in plan.settings}
    dp = int(s["data_parallel_size"].value)
    verdict, tokens, concurrency = plan.verdict, plan.kv_tokens, plan.concurrency
    kv_bytes, non_kv = plan.kv_cache_bytes, plan.non_kv_bytes
    for other in plan.other_outcomes:
        if verdict.outcome == "starts" and (other.verdict.outcome != "starts" or other.kv_tokens < tokens):
            text = f"{other.verdict.text} (where the {other.name}; {plan.verdict.text} otherwise)"
            verdict = other.verdict.model_copy(update={"text": text})
            tokens, concurrency = other.kv_tokens, other.concurrency
            kv_bytes, non_kv = other.kv_cache_bytes, other.non_kv_bytes
    starts = verdict.outcome == "starts"
    tokens = tokens if starts else 0
    concurrency = concurrency if starts else 0.0
    return SearchCandidate(
        vllm_version=version, gpus=layout.gpus, tensor_parallel_size=int(s["tensor_parallel_size"].value),
        data_parallel_size=dp, pipeline_parallel_size=int(s["pipeline_parallel_size"].value),
        enable_expert_parallel=bool(s["enable_expert_parallel"].value),
        all2all_backend=str(s["all2all_backend"].value), moe_backend=str(s["moe_backend"].value),
        moe_backend_source=s["moe_backend"].source, max_num_batched_tokens=int(s["max_num_batched_tokens"].value),
        num_redundant_experts=int(s["num_redundant_experts"].value), kv_cache_dtype=str(s["kv_cache_dtype"].value),
        label=layout.label, outcome=verdict.outcome, verdict=verdict.text,
        kv_bytes_per_token=plan.kv_bytes_per_token, non_kv_bytes=non_kv,
        kv_cache_bytes=kv_bytes if starts else 0, per_gpu_kv_tokens=tokens,
        deployment_kv_tokens=tokens * dp, per_gpu_concurrency=concurrency,
        deployment_concurrency=concurrency * dp, serve=serve,
    )  # fmt: skip


def unplanned(layout: Layout, serve: list[str], version: str, reason: str) -> SearchCandidate:
    return SearchCandidate(
        vllm_version=version, gpus=layout.gpus, tensor_parallel_size=layout.tp, data_parallel_size=layout.dp,
        pipeline_parallel_size=layout.pp,
        enable_expert_parallel=layout.ep, all2all_backend=layout.all2all or "", moe_backend=layout.moe_backend or "",
        moe_backend_source="", max_num_batched_tokens=layout.max_num_batched_tokens or 0,
        num_redundant_experts=layout.num_redundant_experts or 0, kv_cache_dtype=layout.kv_cache_dtype or "auto",
        label=layout.label, outcome="unknown", verdict=reason, kv_bytes_per_token=0, non_kv_bytes=0,
        kv_cache_bytes=0, per_gpu_kv_tokens=0, deployment_kv_tokens=0, per_gpu_concurrency=0.0,
        deployment_concurrency=0.0, serve=serve,
    )  # fmt: skip


def rank_key(objective: Objective) -> Callable[[SearchCandidate], tuple]:
    """Best first. Ties: fewer GPUs, then the larger token budget per step, then less TP, then the label."""
    if objective == "concurrency":
        return lambda c: (-c.deployment_concurrency, c.gpus, -c.max_num_batched_tokens, c.tensor_parallel_size, c.label)
    if objective == "min-gpus":
        return lambda c: (c.gpus, -c.deployment_concurrency, -c.max_num_batched_tokens, c.tensor_parallel_size,
                          c.label)  # fmt: skip
    return lambda c: (-c.deployment_kv_tokens, c.gpus, -c.max_num_batched_tokens, c.tensor_parallel_size, c.label)


def rank(candidates: list[SearchCandidate], objective: Objective,
         min_concurrency: float | None) -> list[SearchCandidate]:  # fmt: skip
    """The candidates with rank set (those that start, and reach --min-concurrency when given), best first, then
    the rest in their order. Each record is copied once (a large search holds one copy at a time)."""

    def meets(c: SearchCandidate) -> bool | None:
        return None if min_concurrency is None else c.deployment_concurrency >= min_concurrency

    def eligible(c: SearchCandidate) -> bool:
        return c.outcome == "starts" and meets(c) is not False

    order = sorted((c for c in candidates if eligible(c)), key=rank_key(objective))
    ranked = [c.model_copy(update={"meets_min_concurrency": meets(c), "rank": i}) for i, c in enumerate(order, 1)]
    del order
    rest = [c.model_copy(update={"meets_min_concurrency": meets(c)}) for c in candidates if not eligible(c)]
    return ranked + rest


# --- the search -----------------------------------------------------------------------------------------------------


@dataclass
class ReleaseSearch:
    version: str
    reads: ReleaseReads
    candidates: list[SearchCandidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


Progress = Callable[[str, int, int], None]  # (release, done, total)


def search(request: SearchRequest, progress: Progress | None = None) -> SearchReport:
    """Plan every candidate of every release; raises SearchError, ServeArgsError, ModelConfigError,
    VllmSourceError for bad input."""
    from harness.sizing import release_defaults as defaults
    from harness.sizing.deployment_plan import plan_source
    from harness.sizing.model_config import load_model
    from harness.sizing.moe_selection import cutlass_refusal
    from harness.sizing.serve_args import parse_serve
    from harness.sizing.vllm_source.sources import locate

    words = list(request.serve)
    model, spec, _ = parse_serve(words)
    given = given_flags(words)
    facts = load_model(model)
    if request.objective == "min-gpus" and request.min_concurrency is None:
        raise SearchError("--objective min-gpus needs --min-concurrency C (the concurrency at --max-model-len the "
                          "deployment must reach)")  # fmt: skip
    releases: list[ReleaseSearch] = []
    for version in dict.fromkeys(request.vllm_versions):
        reads = ReleaseReads(locate(version=version, cache_dir=request.cache_dir))
        found = ReleaseSearch(version=version, reads=reads)

        def default_tokens(batched: bool, files=reads.files) -> int:
            value = defaults.max_num_batched_tokens(files, batched_dp=batched, gpu_bytes=request.total_bytes,
                                                    gpu=gpu_name(request)).value  # fmt: skip
            return int(value)  # type: ignore[call-overload]

        layouts: list[Layout] = []
        for n in request.gpu_counts:  # counted as they are made: an oversized search stops at the cap, not after
            for layout in candidates(facts, spec, given, n, reads, request, default_tokens):
                layouts.append(layout)
                if len(layouts) > MAX_CANDIDATES:
                    raise SearchError(f"--gpus {_counts(request.gpu_counts)}: more than {MAX_CANDIDATES} layouts on "
                                      f"vLLM {version}; allowed: at most {MAX_CANDIDATES} (give fewer GPU counts, or "
                                      "fix flags on the serve line)")  # fmt: skip
        if not layouts:
            fixed = ", ".join(f"--{g.replace('_', '-')}" for g in ("tensor_parallel_size", "data_parallel_size")
                              if g in given) or "the attention heads"  # fmt: skip
            raise SearchError(f"--gpus {_counts(request.gpu_counts)}: no layout of these GPU counts "
                              f"fits {fixed} of the serve line (TP x DP must equal the GPUs, TP a power of two up "
                              f"to {MAX_TP} dividing {facts.num_attention_heads} attention heads)")  # fmt: skip
        refusal = cutlass_refusal(reads.files) if facts.quant_method == "fp8" else None
        if refusal is not None:
            forced = [x for x in layouts if x.moe_backend == "cutlass"]
            layouts = [x for x in layouts if x.moe_backend != "cutlass"]
            if forced or spec.moe_backend == "cutlass":
                found.notes.append(
                    f"--moe-backend cutlass on vLLM {version} for this FP8 checkpoint: {refusal}"
                    + (f"; {len(forced)} layouts forcing it not searched" if forced else "")
                )
        offered = offered_all2all(reads)
        unsized = [a for a in offered if a not in SIZED_ALL2ALL]
        if unsized and "all2all_backend" not in given and facts.is_moe:
            found.notes.append(f"all2all backends vLLM {version} offers that the plan does not size, not searched: "
                               f"{', '.join(unsized)}")  # fmt: skip
        by_line: dict[str, Layout] = {}
        for i, layout in enumerate(layouts):
            serve = serve_words(words, layout, given)
            layout_spec = spec_of(spec, layout, given)
            by_line[shell_line(serve)] = layout
            try:
                plan = plan_source(facts, layout_spec, reads.source, gpu=request.gpu,
                                   total_bytes=request.total_bytes, reads=reads)  # fmt: skip
            except ScenarioError as error:  # the MoE layer at this layout is not one the layer model takes
                found.candidates.append(unplanned(layout, serve, version, f"unknown: the MoE layer: {error}"))
            else:
                found.candidates.append(candidate_of(plan, layout, serve, version))
            if progress is not None:
                progress(version, i + 1, len(layouts))
        unranked, found.candidates = found.candidates, []
        found.candidates = rank(unranked, request.objective, request.min_concurrency)
        del unranked
        for c in found.candidates[: request.top]:  # the lines a user pastes read back as the spec that was planned
            planned = spec_of(spec, by_line[c.serve_line], given)
            if parse_serve(c.serve)[1] != planned:
                raise RuntimeError(f"the search planned {planned!r} for `{c.serve_line}`, which reads as "
                                   f"{parse_serve(c.serve)[1]!r}")  # fmt: skip
        releases.append(found)
    return _report(request, facts, releases)


def _counts(counts: tuple[int, ...]) -> str:
    text = ",".join(map(str, counts))
    return text if len(text) <= 40 else f"{text[:40]}... ({len(counts)} counts)"


def _report(request: SearchRequest, facts: ModelFacts, releases: list[ReleaseSearch]) -> SearchReport:
    out = []
    for r in releases:
        best = next((c for c in r.candidates if c.rank == 1), None)
        out.append(SearchRelease(
            vllm_version=r.version, candidates=len(r.candidates),
            starting=sum(c.outcome == "starts" for c in r.candidates), distinct_layers=r.reads.distinct_layers,
            best=best.label if best else None, why=why_it_wins(r.candidates, request.objective, facts),
            notes=[*(backend_notes(r.candidates) if facts.is_moe else []), *r.notes]))  # fmt: skip
    return SearchReport(
        harness_version=harness.__version__, python_version=platform.python_version(),
        input_hash=input_hash(request), model=facts.name, gpu=gpu_name(request), gpu_total_bytes=request.total_bytes,
        gpu_counts=list(request.gpu_counts), vllm_versions=[r.version for r in releases],
        objective=request.objective, min_concurrency=request.min_concurrency, allow=list(request.allow),
        search_backends=request.search_backends, serve=list(request.serve), releases=out,
        changes=release_changes(releases), candidates=[c for r in releases for c in r.candidates])  # fmt: skip


def backend_notes(candidates: list[SearchCandidate]) -> list[str]:
    """Which experts backend each all-to-all path was planned with where the line left it to vLLM, and where that
    choice came from (one line per distinct choice)."""
    seen: dict[str, str] = {}
    for c in candidates:
        if "--moe-backend" in c.serve:
            continue
        batched = c.enable_expert_parallel and c.all2all_backend == "deepep_low_latency" and c.data_parallel_size > 1
        path = "batched (deepep_low_latency)" if batched else ("EP" if c.enable_expert_parallel else "TP")
        seen.setdefault(f"{path}: {c.moe_backend}", c.moe_backend_source)
    return [f"experts backend assumed, {k} ({v})" for k, v in seen.items()]


def _metric(c: SearchCandidate, objective: Objective) -> str:
    if objective == "kv-tokens":
        return f"{c.deployment_kv_tokens} KV tokens"
    return f"{c.deployment_concurrency:.2f}x concurrency"


def why_it_wins(candidates: list[SearchCandidate], objective: Objective, facts: ModelFacts) -> list[str]:
    """The best layout against the best of each other TP (same GPUs), in bytes: what each GPU holds besides the
    KV cache, the KV bytes per token, the tokens per GPU and how many DP ranks hold a cache."""
    ranked = [c for c in candidates if c.rank is not None]
    if not ranked:
        return []
    best = ranked[0]
    lines = [f"best: {best.label} on {best.gpus} GPUs: {best.non_kv_bytes / GIB:.2f} GiB per GPU before the KV "
             f"cache, {best.kv_cache_bytes / GIB:.2f} GiB of KV cache at {best.kv_bytes_per_token} B/token = "
             f"{best.per_gpu_kv_tokens} tokens per GPU x DP {best.data_parallel_size} caches = "
             f"{best.deployment_kv_tokens} tokens ({best.deployment_concurrency:.2f}x concurrency at "
             f"{_max_len(best)})"]  # fmt: skip
    splits = {(c.tensor_parallel_size, c.pipeline_parallel_size) for c in ranked if c.gpus == best.gpus}
    for tp, pp in sorted(splits - {(best.tensor_parallel_size, best.pipeline_parallel_size)}):
        other = next(c for c in ranked if c.gpus == best.gpus and (c.tensor_parallel_size,
                                                                   c.pipeline_parallel_size) == (tp, pp))  # fmt: skip
        parts = []
        if tp > 1:
            parts.append(f"MLA's latent is not split by TP: its {tp} TP GPUs hold the same tokens" if facts.is_mla
                         else f"TP {tp} splits the KV heads")  # fmt: skip
        if pp > 1:
            parts.append(f"PP {pp} splits the layers")
        split = "; ".join(parts) + f": {other.kv_bytes_per_token} B/token per GPU" if parts else \
            f"{other.kv_bytes_per_token} B/token per GPU"  # fmt: skip
        lines.append(f"vs {other.label}: {other.non_kv_bytes / GIB:.2f} GiB before the KV cache, "
                     f"{other.per_gpu_kv_tokens} tokens per GPU x DP {other.data_parallel_size} = "
                     f"{other.deployment_kv_tokens} tokens ({split}); {_metric(best, objective)} against "
                     f"{_metric(other, objective)}")  # fmt: skip
    return lines


def _max_len(c: SearchCandidate) -> str:
    words = c.serve
    return next((f"{words[i + 1]} tokens" for i, w in enumerate(words[:-1]) if w == "--max-model-len"),
                "max_model_len")  # fmt: skip


def release_changes(releases: list[ReleaseSearch]) -> list[str]:
    """What each release changes in the best layout against the one before it."""
    lines = []
    for before, after in itertools.pairwise(releases):
        a = next((c for c in before.candidates if c.rank == 1), None)
        b = next((c for c in after.candidates if c.rank == 1), None)
        if a is None or b is None:
            lines.append(f"vllm {before.version} -> {after.version}: best {a.label if a else 'none starts'} -> "
                         f"{b.label if b else 'none starts'}")  # fmt: skip
            continue
        same = next((c for c in before.candidates if c.label == b.label and c.gpus == b.gpus), None)
        lines.append(
            f"vllm {before.version} -> {after.version}: best {a.label} ({a.gpus} GPUs, {a.deployment_kv_tokens} "
            f"tokens, {a.deployment_concurrency:.2f}x) -> {b.label} ({b.gpus} GPUs, {b.deployment_kv_tokens} tokens, "
            f"{b.deployment_concurrency:.2f}x): {b.deployment_kv_tokens - a.deployment_kv_tokens:+d} tokens"
            + (f"; {b.label} on {before.version}: {same.verdict}" if same is not None and same.label != a.label
               else ""))  # fmt: skip
        lines.append(f"vllm {before.version} -> {after.version}: {_largest_change(before, after)}")
    return lines


def _largest_change(before: ReleaseSearch, after: ReleaseSearch) -> str:
    """How many layouts the release changes, and the one it changes most (deployment KV tokens)."""
    old = {(c.gpus, c.label): c for c in before.candidates}
    changed = [(c.deployment_kv_tokens - old[k].deployment_kv_tokens, c, old[k]) for c in after.candidates
               if (k := (c.gpus, c.label)) in old and (c.outcome, c.deployment_kv_tokens) !=
               (old[k].outcome, old[k].deployment_kv_tokens)]  # fmt: skip
    if not changed:
        return f"no layout changes ({len(after.candidates)} compared)"
    gain, b, a = max(changed, key=lambda x: (abs(x[0]), x[1].label))
    return (
        f"{len(changed)} of {len(after.candidates)} layouts change; the most: {b.label} ({b.gpus} GPUs) "
        f"{a.outcome} {a.deployment_kv_tokens} -> {b.outcome} {b.deployment_kv_tokens} tokens ({gain:+d})"
    )


# --- output ---------------------------------------------------------------------------------------------------------


def render_release(report: SearchReport, version: str, top: int) -> list[Any]:
    """The ranked table, the reasons the others do not start, why the best wins, the notes."""
    from rich.table import Table

    release = next(r for r in report.releases if r.vllm_version == version)
    mine = [c for c in report.candidates if c.vllm_version == version]
    ranked = [c for c in mine if c.rank is not None]
    title = (
        f"{report.model} on {'/'.join(str(n) for n in report.gpu_counts)} x {report.gpu or 'budget'}, vLLM "
        f"{version}: {release.candidates} layouts, {release.starting} start; ranked by {report.objective}"
        + (f" (at least {report.min_concurrency:g}x concurrency)" if report.min_concurrency is not None else "")
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (("rank", "right"), ("layout", "left"), ("GPUs", "right"), ("per-GPU KV tokens", "right"),
                          ("deployment KV tokens", "right"), ("concurrency", "right"), ("verdict", "left"),
                          ("vllm serve", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in ranked[:top]:
        table.add_row(str(c.rank), c.label, str(c.gpus), str(c.per_gpu_kv_tokens), str(c.deployment_kv_tokens),
                      f"{c.deployment_concurrency:.2f}x", c.outcome, c.serve_line)  # fmt: skip
    out: list[Any] = [table]
    if ranked:
        out.append(f"best on {version}: {ranked[0].serve_line}")
    if len(ranked) > top:
        out.append(f"... {len(ranked) - top} more that start (--top N shows more; --json has every one)")
    reasons: dict[str, list[SearchCandidate]] = {}
    for c in mine:
        if c.rank is None:
            reason = c.verdict if c.outcome != "starts" else \
                f"under --min-concurrency {report.min_concurrency:g}: {c.deployment_concurrency:.2f}x"  # fmt: skip
            reasons.setdefault(_reason_kind(reason), []).append(c)
    if reasons:
        out.append(f"not ranked on {version}:")
        for kind, group in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            out.append(f"  {len(group)} x {kind} on {version}; e.g. {group[0].label}: {group[0].verdict}")
    out += [f"why: {line}" for line in release.why]
    out += [f"note: {line}" for line in release.notes]
    return out


def _reason_kind(text: str) -> str:
    """A verdict's kind without its figures: 'OOM at moe-workspace', 'refused: deepep-rdma', 'fails: ...'."""
    head = text.split(":")[0]
    if text.startswith("refused"):
        return f"refused: {text.split(':')[1].split()[0]}" if ":" in text else head
    if text.startswith("fails"):
        return "fails: " + ("no memory left for the KV cache" if "no memory" in text else "KV cache under one request")
    return head


def objective_metric(c: SearchCandidate, objective: Objective) -> float:
    return float(c.deployment_kv_tokens) if objective == "kv-tokens" else c.deployment_concurrency


def gpus_needed(report: SearchReport) -> list[str]:
    """For --objective min-gpus: per release, the fewest GPUs reaching --min-concurrency."""
    lines = []
    for r in report.releases:
        best = next((c for c in report.candidates if c.vllm_version == r.vllm_version and c.rank == 1), None)
        lines.append(
            f"vllm {r.vllm_version}: "
            + (
                f"{best.gpus} GPUs reach {report.min_concurrency:g}x concurrency ({best.label}: "
                f"{best.deployment_concurrency:.2f}x)"
                if best
                else f"no layout of {', '.join(map(str, report.gpu_counts))} GPUs reaches {report.min_concurrency:g}x"
            )
        )
    return lines
