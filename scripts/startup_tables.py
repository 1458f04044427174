"""Print the error tables of docs/deployment-memory.md from the test data: every published startup log
(tests/data/startup_logs) and every real startup (tests/data/real_startups), each planned for its own release by
harness.verify.planning.plan_record, the function the tests use. Paste the output over the tables.

    python scripts/startup_tables.py published
    python scripts/startup_tables.py real

MoE cases read their release's source (downloaded into the harness cache once, as `harness plan` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.sizing.deployment import GIB
from harness.sizing.model_config import ModelConfigError
from harness.verify.compare import taken_outcome
from harness.verify.planning import plan_record, record_facts
from harness.verify.record import StartupRecord, load_record

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
COMMON_KWARGS = {"max_model_len": 4096, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
                 "gpu_memory_utilization": 0.9}  # fmt: skip


def _error(predicted: float, logged: float | None) -> str:
    return f"{(predicted - logged) / logged:+.2%}" if logged else "-"


def _groups(plan, *names: str) -> float:
    return sum(plan.group_bytes(g) for g in names) / GIB


def published_row(name: str, case: StartupRecord) -> str:
    f = case.figures
    command = " ".join(case.serve[2:])
    head = f"| {name} | {case.vllm_version} | {case.gpu} | {command} | {f.model_loading_gib} |"
    try:
        plan = plan_record(case)
    except ModelConfigError as error:
        why = case.unsized or f"not sized: {error}"
        return f"{head} - | {f.available_kv_cache_gib or '-'} | - | {f.kv_cache_tokens or '-'} | {why} |"
    weights = _error(_groups(plan, "weights"), f.model_loading_gib)
    kv = _error(plan.kv_tokens, f.kv_cache_tokens) if f.kv_cache_tokens and f.non_kv_gib else "-"
    approximate = "; ".join(plan.approximate) or "-"
    return f"{head} {weights} | {f.available_kv_cache_gib or '-'} | {kv} | {f.kv_cache_tokens or '-'} | {approximate} |"


def real_row(name: str, case: StartupRecord) -> str:
    f = case.figures
    plan = plan_record(case)
    facts = record_facts(case)
    arch = facts.architecture.removesuffix("ForCausalLM").removesuffix("ForConditionalGeneration")
    layers = f"{arch} ({facts.num_hidden_layers} layers)"
    settings = ", ".join(f"{k}={v}" for k, v in (case.llm_kwargs or {}).items() if COMMON_KWARGS.get(k) != v) or "-"
    backends = case.backends
    chosen = " / ".join(x for x in (backends.attention if backends else None,
                                    " ".join(filter(None, (backends.moe, backends.moe_experts))) if backends else None)
                        if x) or "-"  # fmt: skip
    graphs = "none" if f.cuda_graph_estimate_gib is None else f"{f.cuda_graph_estimate_gib:.2f}"
    taken = taken_outcome(plan, f.torch_peak_increase_gib)  # the plan's other outcome, where vLLM took it
    peak = _groups(plan, "held-once", "profile-peak") + (taken.torch_peak_extra_bytes / GIB if taken else 0.0)
    tokens = (taken or plan).kv_tokens
    if taken is not None:
        name += f" ({taken.name})"
    cells = [name, layers, settings, (case.model_runner or "-").upper(), chosen,
             f"{f.model_loading_gib:.2f} / {_groups(plan, 'weights'):.2f}",
             f"{f.torch_peak_increase_gib:.2f} / {peak:.2f}",
             f"{f.non_torch_increase_gib:.2f} / {_groups(plan, 'non-torch'):.2f}",
             f"{graphs} / {_groups(plan, 'cuda-graphs'):.2f}",
             f"{f.kv_cache_tokens:,}", _error(tokens, f.kv_cache_tokens)]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str]) -> int:
    if argv not in (["published"], ["real"]):
        print("usage: python scripts/startup_tables.py published|real", file=sys.stderr)
        return 2
    kind = argv[0]
    folder = DATA / ("startup_logs" if kind == "published" else "real_startups")
    for path in sorted(folder.glob("*.yaml")):
        case = load_record(path)
        print(published_row(path.stem, case) if kind == "published" else real_row(path.stem, case))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
