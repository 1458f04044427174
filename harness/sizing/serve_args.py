"""`vllm serve MODEL FLAGS`, read as vLLM users write it, into a DeploymentSpec.

Only the flags that change memory are read; a handful that do not (host, port, names, logging, parsers) are
accepted and listed as ignored. Any other flag is refused with one line naming it: a plan that silently
dropped a flag could say a deployment starts when it does not.
"""

from __future__ import annotations

import argparse
import re

from pydantic import ValidationError

from harness.scenario.deployment import ALL2ALL_BACKENDS, KV_CACHE_DTYPES, DeploymentSpec
from harness.sizing.model_config import DTYPE_CHOICES, loads_bounded
from harness.sizing.quant_formats import QUANTIZATION_CHOICES

# Flags that do not change the GPU memory of a worker: accepted, reported as ignored.
NEUTRAL_FLAGS_WITH_VALUE = (
    "--host", "--port", "--served-model-name", "--api-key", "--uvicorn-log-level", "--tool-call-parser",
    "--reasoning-parser", "--chat-template", "--tokenizer", "--tokenizer-mode", "--seed", "--download-dir",
    "--distributed-executor-backend", "--data-parallel-address", "--data-parallel-rpc-port",
    "--data-parallel-size-local", "--data-parallel-start-rank", "--api-server-count", "--load-format",
    "--revision",
)  # fmt: skip
NEUTRAL_SWITCHES = (
    "--trust-remote-code", "--disable-log-requests", "--disable-log-stats", "--enable-auto-tool-choice",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill", "--headless",
    "--disable-uvicorn-access-log",
)  # fmt: skip


class ServeArgsError(Exception):
    """One line: the flag, the value and what is allowed."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ServeArgsError(f"vllm serve: {message}")


def _size(text: str) -> int:
    """vLLM's human-readable integers (arg_utils.human_readable_int): 32768, 32k (x 1000), 32K (x 1024), 1m, 1M."""
    match = re.fullmatch(r"(\d{1,9})([kKmM]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not a token count (e.g. 32768, 32k, 32K)")
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[match.group(2)]
    return int(match.group(1)) * scale


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not a number in (0, 1]") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not a number in (0, 1]")
    return value


def _positive(text: str) -> int:
    if not re.fullmatch(r"\d{1,7}", text) or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not an integer > 0")
    return int(text)


def _count(text: str) -> int:
    if not re.fullmatch(r"\d{1,7}", text):
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not an integer >= 0")
    return int(text)


def _parser() -> _Parser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=_positive, default=None)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true", default=False)
    p.add_argument("--all2all-backend", choices=ALL2ALL_BACKENDS, default=None)
    p.add_argument("--moe-backend", choices=("cutlass", "deep_gemm", "triton"), default=None)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=None)
    p.add_argument("--max-model-len", type=_size, default=None)
    p.add_argument("--max-num-batched-tokens", type=_size, default=None)
    p.add_argument("--max-num-seqs", type=_positive, default=None)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--block-size", type=_positive, default=None)
    p.add_argument("--enable-eplb", action="store_true", default=False)
    p.add_argument("--eplb-config", default=None)
    p.add_argument("--num-redundant-experts", type=_count, default=None)
    p.add_argument("--enable-dbo", action="store_true", default=False)
    p.add_argument("--enforce-eager", action="store_true", default=False)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default=None)
    p.add_argument("--quantization", "-q", choices=QUANTIZATION_CHOICES, default=None)
    for flag in NEUTRAL_FLAGS_WITH_VALUE:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), default=None)
    for flag in NEUTRAL_SWITCHES:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), action="store_true", default=False)
    return p


def parse_serve(argv: list[str]) -> tuple[str, DeploymentSpec, list[str]]:
    """(model, spec, ignored flags) from `vllm serve MODEL FLAGS` (the leading `vllm serve` may be left out)."""
    words = list(argv)
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    elif words[:1] == ["serve"]:
        words = words[1:]
    elif words[:1] == ["vllm"]:
        raise ServeArgsError("vllm serve: only `vllm serve MODEL ...` is read; got `vllm "
                             f"{' '.join(words[1:2])[:30]}`")  # fmt: skip
    unknown = [w.split("=")[0] for w in words if w.startswith("-")]
    parser = _parser()
    known = {o for a in parser._actions for o in a.option_strings}
    bad = next((w for w in unknown if w not in known), None)
    if bad is not None:
        raise ServeArgsError(f"vllm serve: flag {bad[:60]} is not one the plan understands; it reads: "
                             + ", ".join(sorted(o for o in known if o.startswith("--") and not _is_ignored(o))))
    ns = parser.parse_args(words)
    model = ns.model or ns.model_tag
    if model is None:
        raise ServeArgsError("vllm serve: no MODEL given; allowed: a model directory holding config.json or a preset")
    if ns.model and ns.model_tag and ns.model != ns.model_tag:
        raise ServeArgsError(f"vllm serve: MODEL {ns.model_tag[:60]} and --model {ns.model[:60]} differ")
    redundant = ns.num_redundant_experts
    if ns.eplb_config is not None:
        redundant = _eplb_redundant(ns.eplb_config, redundant)
    ignored = [f"--{k.removeprefix('ignored_').replace('_', '-')}" for k, v in vars(ns).items()
               if k.startswith("ignored_") and v not in (None, False)]  # fmt: skip
    try:
        spec = DeploymentSpec(
            model=model, tensor_parallel_size=ns.tensor_parallel_size, data_parallel_size=ns.data_parallel_size or 1,
            enable_expert_parallel=ns.enable_expert_parallel, all2all_backend=ns.all2all_backend,
            moe_backend=ns.moe_backend, gpu_memory_utilization=ns.gpu_memory_utilization,
            max_model_len=ns.max_model_len, max_num_batched_tokens=ns.max_num_batched_tokens,
            max_num_seqs=ns.max_num_seqs, kv_cache_dtype=ns.kv_cache_dtype, block_size=ns.block_size,
            enable_eplb=ns.enable_eplb, num_redundant_experts=redundant, enable_dbo=ns.enable_dbo,
            enforce_eager=ns.enforce_eager, dtype=ns.dtype, quantization=ns.quantization,
        )  # fmt: skip
    except ValidationError as error:
        first = error.errors()[0]
        field = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "vllm serve"
        raise ServeArgsError(f"vllm serve: {field} {str(first.get('input'))[:40]}: {first['msg']}") from None
    if spec.num_redundant_experts and not spec.enable_eplb:
        raise ServeArgsError(f"vllm serve: num_redundant_experts {spec.num_redundant_experts} needs --enable-eplb "
                             "(vLLM refuses it otherwise, config/parallel.py)")  # fmt: skip
    return model, spec, ignored


def _is_ignored(flag: str) -> bool:
    return flag in NEUTRAL_FLAGS_WITH_VALUE or flag in NEUTRAL_SWITCHES


def _eplb_redundant(text: str, older: int | None) -> int | None:
    try:
        config = loads_bounded(text, what="--eplb-config")
    except ValueError as error:
        why = str(error) if "nests" in str(error) else "is not JSON"
        raise ServeArgsError(f"vllm serve: --eplb-config {text[:40]!r}: {why}; vLLM reads a JSON object, e.g. "
                             "'{\"num_redundant_experts\": 32}'") from None  # fmt: skip
    if not isinstance(config, dict):
        raise ServeArgsError(f"vllm serve: --eplb-config {text[:60]!r} is not a JSON object")
    value = config.get("num_redundant_experts", older)
    if value is not None and (type(value) is not int or value < 0):
        raise ServeArgsError(f"vllm serve: --eplb-config num_redundant_experts {str(value)[:20]} is not an integer >= 0")
    if older is not None and value != older:
        raise ServeArgsError(f"vllm serve: --num-redundant-experts {older} and --eplb-config's {value} differ")
    return value
