"""A vLLM startup log's text into the figures it printed, the backends it chose, the model runner it used, the log's
key lines and, for a startup that did not finish, vLLM's own error line. Read-only text processing: nothing of
vLLM is imported.

The lines read (vLLM 0.26.0's wording; the older profiler summary of earlier releases too):

    [v1/worker/gpu_model_runner.py] Model loading took 5.81 GiB memory and 0.46 seconds      (V1 runner)
    [v1/worker/gpu/model_runner.py] Model loading took 3.63 GiB and 2.10 seconds             (V2 runner)
    Memory profiling takes 17.00 seconds. Total non KV cache memory: 6.38GiB; torch peak memory increase: 0.74GiB;
        non-torch forward increase memory: 0.22GiB; weights memory: 5.41GiB.                   (DEBUG)
        ... total consumed (from mem_get_info): 6.10GiB; weights memory: 5.41GiB.   (0.27.0 on, no non-torch)
    Estimated CUDA graph memory: 0.26 GiB total
    Available KV cache memory: 119.44 GiB
    GPU KV cache size: 3,913,760 tokens
    Maximum concurrency for 4,096 tokens per request: 955.51x
    Graph capturing finished in 10 secs, took 0.33 GiB
    Free memory on device (139.29/139.8 GiB) on startup. Desired GPU memory utilization is (0.9, 125.82 GiB). ...
    Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', ...].
    Using TRITON Unquantized MoE backend out of potential backends: ['TRITON', ...].
    Using TritonExperts MoE backend
    Using 'MARLIN' WNA16 MoE backend.                                                       (WNA16 checkpoints)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.verify.record import Backends, StartupFigures

MAX_LOG_BYTES = 256 << 20
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_INT = r"([0-9][0-9,]*)"

# One line of vLLM's logger: "(EngineCore pid=704) INFO 12-01 23:51:40 [file.py:123] message".
_PREFIX = re.compile(r"^(?:\(\w+(?:_\w+)? pid=\d+\)\s+)?(?:\x1b\[[0-9;]*m)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                     r"(?:\x1b\[[0-9;]*m)?\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+")  # fmt: skip

FIGURE_PATTERNS: dict[str, re.Pattern[str]] = {
    "model_loading": re.compile(rf"Model loading took {_NUM} ?GiB"),
    "breakdown": re.compile(
        rf"Total non KV cache memory: {_NUM} ?GiB; torch peak memory increase: {_NUM} ?GiB; "
        rf"non-torch forward increase memory: {_NUM} ?GiB"
    ),
    # 0.27.0 on (utils/mem_utils.py): the non-KV total is what the driver saw consumed plus the transient peak
    # headroom; the non-torch increase is no longer printed
    "breakdown_consumed": re.compile(
        rf"Total non KV cache memory: {_NUM} ?GiB; torch peak memory increase: {_NUM} ?GiB; "
        rf"total consumed \(from mem_get_info\): {_NUM} ?GiB; weights memory: {_NUM} ?GiB"
    ),
    "breakdown_old": re.compile(
        rf"model weights take {_NUM} ?GiB; non_torch_memory takes {_NUM} ?GiB; PyTorch "
        rf"activation peak memory takes {_NUM} ?GiB"
    ),
    "total_old": re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\) = {_NUM} ?GiB"),
    "cuda_graph_estimate": re.compile(rf"Estimated CUDA graph memory: {_NUM} ?GiB total"),
    "available_kv": re.compile(rf"Available KV cache memory: {_NUM} ?GiB"),
    "kv_tokens": re.compile(rf"GPU KV cache size: {_INT} tokens"),
    "concurrency": re.compile(rf"Maximum concurrency for {_INT} tokens per request: {_NUM}x"),
    "graphs_taken": re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB"),
    "free_on_startup": re.compile(
        rf"Free memory on device \({_NUM}/{_NUM} ?GiB\) on startup\. Desired GPU memory "
        rf"utilization is \({_NUM}, {_NUM} ?GiB\)"
    ),
    "requested": re.compile(rf"Requested memory: {_NUM} \(util\), {_NUM} ?GiB"),
    "blocks": re.compile(rf"(?:# GPU blocks|num_gpu_blocks(?: is)?):? {_INT}"),
}
ATTENTION = re.compile(r"Using (\w+) attention backend out of potential backends: \[([^\]]*)\]")
MOE = re.compile(r"Using (.+?) MoE backend out of potential backends: \[([^\]]*)\]")
EXPERTS = re.compile(r"Using (\w+) MoE backend\s*$")
WNA16 = re.compile(r"Using '(\w+)' WNA16 MoE backend\.")  # int_wna16.py select_wna16_moe_backend's _make_log_backend
OTHER_KEYS = re.compile(r"Initializing a V1 LLM engine|Profiling CUDA graph memory|CUDA graph memory: .*first-capture|"
                        r"Defaulting|Enforce eager|"
                        r"Model Runner V2|V1 model runner|"
                        r"Using FlashAttention version|non-default args|Requested memory|"
                        r"KV cache memory in use")  # fmt: skip
# A Python exception's last line, as vLLM's engine core prints it before "Engine core initialization failed".
EXCEPTION = re.compile(r"^(?:\(\w+ pid=\d+\)\s+)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)): (.+)$")
VERSION = re.compile(r"(?:LLM engine \(v|vLLM (?:API )?server version |vLLM version )v?([0-9]+\.[0-9]+\.[0-9]+)")
DEFAULTING = re.compile(r"Defaulting (max_num_batched_tokens|max_num_seqs) to ([0-9]+) for (\w+) usage context")
GENERIC_FAILURES = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "See root cause above",
    "Worker failed with error",
)


@dataclass
class ParsedLog:
    figures: StartupFigures
    backends: Backends
    model_runner: str | None
    key_lines: list[str]
    error: str | None
    ready: bool  # the figures a startup ends with (the KV cache's size) were printed
    found: list[str] = field(default_factory=list)  # which FIGURE_PATTERNS matched
    vllm_version: str | None = None  # as the log states it
    defaults: dict[str, int] = field(default_factory=dict)  # what vLLM defaulted ("Defaulting ... usage context")
    usage_context: str | None = None  # LLM_CLASS or OPENAI_API_SERVER, where the log says


def message(line: str) -> str:
    """The line without vLLM's process/level/time prefix, "[file:line] message" kept."""
    return _PREFIX.sub("", line.rstrip())


def _float(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_log(text: str) -> ParsedLog:
    values: dict[str, object] = {}
    backends: dict[str, object] = {}
    runner: str | None = None
    key: list[str] = []
    found: list[str] = []
    errors: list[str] = []
    logged_errors: list[str] = []
    version: str | None = None
    defaulted: dict[str, int] = {}
    usage: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if len(line) > 20000:
            line = line[:20000]
        hit = False
        for name, pattern in FIGURE_PATTERNS.items():
            m = pattern.search(line)
            if m is None:
                continue
            hit = True
            found.append(name)
            g = m.groups()
            if name == "model_loading":
                values["model_loading_gib"] = _float(g[0])
                if "v1/worker/gpu/model_runner.py" in line:
                    runner = "v2"
                elif "gpu_model_runner.py" in line:
                    runner = "v1"
            elif name == "breakdown":
                values.update(non_kv_gib=_float(g[0]), torch_peak_increase_gib=_float(g[1]),
                              non_torch_increase_gib=_float(g[2]))  # fmt: skip
            elif name == "breakdown_consumed":
                values.update(non_kv_gib=_float(g[0]), torch_peak_increase_gib=_float(g[1]))
            elif name == "breakdown_old":
                values.update(torch_peak_increase_gib=_float(g[2]), non_torch_increase_gib=_float(g[1]))
            elif name == "total_old":
                values.update(gpu_total_gib=_float(g[0]), requested_gib=_float(g[2]))
            elif name == "cuda_graph_estimate":
                values["cuda_graph_estimate_gib"] = _float(g[0])
            elif name == "available_kv":
                values["available_kv_cache_gib"] = _float(g[0])
            elif name == "kv_tokens":
                values["kv_cache_tokens"] = _int(g[0])
            elif name == "concurrency":
                values.update(max_model_len=_int(g[0]), max_concurrency=_float(g[1]))
            elif name == "graphs_taken":
                values["cuda_graph_actual_gib"] = _float(g[1])
            elif name == "free_on_startup":
                values.setdefault("gpu_total_gib", _float(g[1]))
                values.setdefault("requested_gib", _float(g[3]))
            elif name == "requested":
                values.setdefault("requested_gib", _float(g[1]))
            elif name == "blocks":
                values["num_gpu_blocks"] = _int(g[0])
        v = VERSION.search(line)
        if v and version is None:
            version = v.group(1)
        d = DEFAULTING.search(line)
        if d:
            defaulted[d.group(1)] = int(d.group(2))
            usage = d.group(3)
        m = ATTENTION.search(line)
        if m:
            hit = True
            backends.update(attention=m.group(1), attention_candidates=re.findall(r"'([^']+)'", m.group(2)))
        m = MOE.search(line)
        if m:
            hit = True
            backends.update(moe=m.group(1), moe_candidates=re.findall(r"'([^']+)'", m.group(2)))
        m = WNA16.search(line)
        if m:
            hit = True
            backends["moe"] = f"{m.group(1)} WNA16"
        m = EXPERTS.search(message(line))
        if m and "out of potential" not in line:
            hit = True
            backends["moe_experts"] = m.group(1)
        if hit or OTHER_KEYS.search(line):
            shown = message(line)
            if shown not in key:
                key.append(shown[:600] + (" ..." if len(shown) > 600 else ""))
        e = EXCEPTION.match(line.strip())
        if e and not any(g in e.group(2) for g in GENERIC_FAILURES):
            errors.append(f"{e.group(1)}: {e.group(2)}"[:500])
        elif re.search(r"\bERROR\b", line) and "Traceback" not in line and line.strip():
            text_error = message(line)
            if not any(g in text_error for g in GENERIC_FAILURES) and text_error:
                logged_errors.append(text_error[:500])
    figures = StartupFigures(**values)  # type: ignore[arg-type]
    if figures.non_kv_gib is None and "breakdown_old" in found and figures.model_loading_gib is not None:
        pass  # the old summary gives no total: leave it unset rather than invent one
    ready = figures.kv_cache_tokens is not None
    # The error that explains a failed start: the first exception line (the root cause comes first in a chain),
    # else the first ERROR line that is not the generic "initialization failed".
    causes = errors or logged_errors
    error = None if ready else (causes[0] if causes else None)
    return ParsedLog(figures=figures, backends=Backends(**backends), model_runner=runner,  # type: ignore[arg-type]
                     key_lines=key, error=error, ready=ready, found=found, vllm_version=version,
                     defaults=defaulted, usage_context=usage)  # fmt: skip


def llm_kwargs_to_serve(model: str, kwargs: dict) -> list[str]:
    """The `vllm serve` command line that gives the engine the LLM class's keyword arguments."""
    words = ["vllm", "serve", model]
    for key, value in kwargs.items():
        if key in ("load_format", "skip_tokenizer_init", "model"):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            import json

            words += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            words += [flag, str(value)]
    return words


class ServeLineError(ValueError):
    """The log's `non-default args` line cannot be read back as a serve line (one line, for the user)."""


_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
# argparse dests `vllm serve` prints that are not engine or frontend flags of their own
_NOT_FLAGS = frozenset({"model_tag", "subparser", "dispatch_function", "model"})


def serve_line_from_log(text: str) -> list[str] | None:
    """`vllm serve MODEL FLAGS` from the log's `non-default args: {...}` line (vllm serve, and the LLM class of
    recent releases, print it at start: the engine arguments that differ from the defaults), or None where the log has
    none. Read as Python literals only (ast.literal_eval, nothing run); a value that is not one (a config object's
    repr) is refused in one line, naming the key: the serve line then has to be given."""
    import ast

    from harness.sizing.serve_args import flag_words

    found = None
    for line in text.splitlines():
        match = _NON_DEFAULT.search(line)
        if match:
            found = match.group(1)
            break
    if found is None:
        return None
    try:
        node = ast.parse(found, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ServeLineError("the log's non-default args line is not a readable dict") from None
    if not isinstance(node, ast.Dict):
        raise ServeLineError("the log's non-default args line is not a dict")
    args: dict[str, object] = {}
    for key_node, value_node in zip(node.keys, node.values, strict=True):
        if not isinstance(key_node, ast.Constant) or not isinstance(key_node.value, str):
            raise ServeLineError("the log's non-default args line has a key that is not a string")
        try:
            args[key_node.value] = ast.literal_eval(value_node)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise ServeLineError(
                f"the log's non-default args give {key_node.value[:40]} as {ast.unparse(value_node)[:60]}, not a "
                "literal the serve line can be rebuilt from; give the serve line after `--`"
            ) from None
    model = args.get("model_tag") or args.get("model")
    if not isinstance(model, str) or not model:
        raise ServeLineError("the log's non-default args name no model (model_tag or model)")
    words = ["vllm", "serve", model]
    for key, value in args.items():
        if key not in _NOT_FLAGS and value is not None:
            name = key.replace("_", "-")
            words += flag_words(f"--{name}", value, false_flag=f"--no-{name}")
    return words
