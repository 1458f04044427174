"""`vllm serve MODEL FLAGS`, read as vLLM users write it, into a DeploymentSpec: every flag of the release.

With a release (harness.sizing.release_flags: the flags its EngineArgs and frontend parsers declare) every flag it
has is accepted and a flag it has not is refused with one line naming the closest ones. Each accepted flag is one of:

    modelled        it changes a worker's GPU memory and the plan sizes it (MODELLED below)
    no GPU memory   ports, logging, parsers, tokenizer options, host memory (--swap-space): listed as ignored
    approximate     it may change GPU memory and is not sized yet: the plan's verdict says it is approximate, and
                    `--fail-on-verdict` does not pass it

FlexibleArgumentParser's spellings are read as vLLM reads them: `--flag=value`, `--flag_name`, `-O3`/`-O 3`,
`--json-flag.key value`. `--env NAME=VALUE` (the harness's, not vLLM's) gives the environment the server runs with.
Without a release (no source at hand) only the modelled flags and the frontend's usual ones are known.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from harness.core.errors import BadInput
from harness.scenario.deployment import ALL2ALL_BACKENDS, DeploymentSpec
from harness.sizing.release_flags import ReleaseFlags

# Flags that change no GPU memory of a worker, beyond the frontend's own (entrypoints/*/cli_args.py, serve.py).
NO_GPU_MEMORY = frozenset({
    "--host", "--port", "--served-model-name", "--api-key", "--uvicorn-log-level", "--tool-call-parser",
    "--reasoning-parser", "--chat-template", "--tokenizer", "--tokenizer-mode", "--seed", "--download-dir",
    "--distributed-executor-backend", "--data-parallel-address", "--data-parallel-rpc-port",
    "--data-parallel-size-local", "--data-parallel-start-rank", "--data-parallel-rank", "--data-parallel-backend",
    "--data-parallel-hybrid-lb", "--data-parallel-external-lb", "--api-server-count", "--load-format", "--revision",
    "--code-revision", "--tokenizer-revision", "--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--enable-log-outputs", "--enable-auto-tool-choice", "--enable-prefix-caching",
    "--prefix-caching-hash-algo", "--enable-chunked-prefill", "--headless", "--disable-uvicorn-access-log",
    "--swap-space", "--generation-config", "--override-generation-config", "--config-format", "--hf-config-path",
    "--hf-token", "--ignore-patterns", "--use-tqdm-on-load", "--master-addr", "--master-port", "--nnodes",
    "--node-rank", "--distributed-timeout-seconds", "--structured-outputs-config", "--guided-decoding-backend",
    "--kv-events-config", "--otlp-traces-endpoint", "--collect-detailed-traces", "--show-hidden-metrics-for-version",
    "--scheduling-policy", "--scheduler-cls", "--async-scheduling", "--no-async-scheduling", "--stream-interval",
    "--worker-cls", "--worker-extension-cls", "--max-parallel-loading-workers", "--ray-workers-use-nsight",
    "--disable-custom-all-reduce", "--logprobs-mode", "--max-logprobs", "--config", "--grpc",
    "--model-loader-extra-config",
    "--safetensors-load-strategy", "--pt-load-map-location", "--long-prefill-token-threshold",
    "--max-num-partial-prefills", "--max-long-partial-prefills", "--disable-chunked-mm-input", "--runner", "--convert",
    "--task", "--enable-sleep-mode", "--aggregate-engine-logging", "--reasoning-parser-plugin",
    "--tool-parser-plugin", "--enable-eplb-log-balancedness", "--eplb-log-balancedness", "--skip-tokenizer-init",
})  # fmt: skip
NO_GPU_MEMORY_WHY = {
    "--swap-space": "host memory (CPU swap space), not the GPU's",
    "--disable-custom-all-reduce": "custom all-reduce's buffers are within the non-torch estimate",
    "--enable-chunked-prefill": "chunked prefill is on in V1 either way; max_num_batched_tokens is read on its own",
}


def _size(text: str) -> int:
    """vLLM's human-readable integers (arg_utils.human_readable_int): 32768, 32k (x 1000), 32K (x 1024), 1m, 1M,
    1g, 1G."""
    match = re.fullmatch(r"(\d{1,12}(?:\.\d{1,6})?)([kKmMgG]?)", text.strip())
    if match is None:
        raise ValueError(f"{text[:30]!r} is not a count (e.g. 32768, 32k, 32K)")
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[match.group(2)]
    value = float(match.group(1)) * scale
    if match.group(2) == "" and "." in match.group(1):
        raise ValueError(f"{text[:30]!r} is not an integer")
    return int(value)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text[:30]!r} is not a number in (0, 1]") from None
    if not 0 < value <= 1:
        raise ValueError(f"{text[:30]!r} is not a number in (0, 1]")
    return value


def _positive(text: str) -> int:
    if not re.fullmatch(r"\d{1,7}", text) or int(text) == 0:
        raise ValueError(f"{text[:30]!r} is not an integer > 0")
    return int(text)


def _count(text: str) -> int:
    if not re.fullmatch(r"\d{1,7}", text):
        raise ValueError(f"{text[:30]!r} is not an integer >= 0")
    return int(text)


def _gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text[:30]!r} is not a size in GiB >= 0") from None
    if not 0 <= value < 1 << 20:
        raise ValueError(f"{text[:30]!r} is not a size in GiB >= 0")
    return value


def _word(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:/\-]{1,80}", text):
        raise ValueError(f"{text[:30]!r} is not a name")
    return text


def _text(text: str) -> str:
    return text[:4000]


def _bool(text: str) -> bool:
    return True


@dataclass(frozen=True)
class Modelled:
    """A flag the deployment model reads."""

    options: tuple[str, ...]
    dest: str
    arity: str  # switch (no value) or value
    convert: Callable[[str], object]


MODELLED: tuple[Modelled, ...] = (
    Modelled(("--model",), "model", "value", _text),
    Modelled(("--tensor-parallel-size", "-tp"), "tensor_parallel_size", "value", _positive),
    Modelled(("--data-parallel-size", "-dp"), "data_parallel_size", "value", _positive),
    Modelled(("--pipeline-parallel-size", "-pp"), "pipeline_parallel_size", "value", _positive),
    Modelled(("--enable-expert-parallel", "-ep"), "enable_expert_parallel", "switch", _bool),
    Modelled(("--all2all-backend",), "all2all_backend", "value", _word),
    Modelled(("--moe-backend",), "moe_backend", "value", _word),
    Modelled(("--gpu-memory-utilization",), "gpu_memory_utilization", "value", _fraction),
    Modelled(("--max-model-len",), "max_model_len", "value", _text),
    Modelled(("--max-num-batched-tokens",), "max_num_batched_tokens", "value", _size),
    Modelled(("--max-num-seqs",), "max_num_seqs", "value", _positive),
    Modelled(("--kv-cache-dtype",), "kv_cache_dtype", "value", _word),
    Modelled(("--block-size",), "block_size", "value", _positive),
    Modelled(("--enable-eplb",), "enable_eplb", "switch", _bool),
    Modelled(("--eplb-config",), "eplb_config", "value", _text),
    Modelled(("--num-redundant-experts",), "num_redundant_experts", "value", _count),
    Modelled(("--enable-dbo",), "enable_dbo", "switch", _bool),
    Modelled(("--enforce-eager",), "enforce_eager", "switch", _bool),
    Modelled(("--kv-cache-memory-bytes",), "kv_cache_memory_bytes", "value", _size),
    Modelled(("--cpu-offload-gb",), "cpu_offload_gb", "value", _gib),
    Modelled(("--dtype",), "dtype", "value", _word),
    Modelled(("--quantization", "-q"), "quantization", "value", _word),
    Modelled(("--optimization-level",), "optimization_level", "value", _word),
    Modelled(("--compilation-config", "-cc"), "compilation_config", "value", _text),
    Modelled(("--cudagraph-capture-sizes",), "cudagraph_capture_sizes", "list", _text),
    Modelled(("--max-cudagraph-capture-size",), "max_cudagraph_capture_size", "value", _text),
    Modelled(("--limit-mm-per-prompt",), "limit_mm_per_prompt", "value", _text),
    Modelled(("--language-model-only",), "language_model_only", "switch", _bool),
    Modelled(("--calculate-kv-scales",), "calculate_kv_scales", "switch", _bool),
    Modelled(("--disable-hybrid-kv-cache-manager",), "disable_hybrid_kv_cache_manager", "switch", _bool),
    Modelled(("--num-gpu-blocks-override",), "num_gpu_blocks_override", "value", _positive),
)  # fmt: skip
_BY_OPTION = {option: m for m in MODELLED for option in m.options}
# Environment variables that size GPU memory: modelled, or known and not yet sized (approximate).
ENV_MODELLED = ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",)
ENV_APPROXIMATE = ("VLLM_FUSED_MOE_CHUNK_SIZE", "VLLM_DEEPEP_BUFFER_SIZE_MB",
                   "VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL", "VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM",
                   "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_ALL2ALL_BACKEND",
                   "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_USE_FLASHINFER_SAMPLER",
                   "PYTORCH_CUDA_ALLOC_CONF", "NCCL_NVLS_ENABLE", "NCCL_BUFFSIZE")  # fmt: skip


class ServeArgsError(BadInput):
    """One line: the flag, the value and what is allowed."""


@dataclass(frozen=True)
class Parsed:
    """The serve line read: the model, its DeploymentSpec, the flags listed as changing no GPU memory, the
    environment given with --env."""

    model: str
    spec: DeploymentSpec
    ignored: list[str]
    env: dict[str, str]


def _normalize(word: str) -> tuple[str, str | None]:
    """(option, inline value) as FlexibleArgumentParser reads it: --a_b=1 -> (--a-b, 1); --cc.x=1 -> (--cc, x=1);
    -O3 -> (-O, 3)."""
    if word.startswith("-O") and not word.startswith("--") and word != "-O":
        return "-O", word[2:].lstrip("=")
    option, eq, value = word.partition("=")
    inline = value if eq else None
    if "." in option and option.startswith("-"):
        option, _, key = option.partition(".")
        inline = f"{key}={inline}" if inline is not None else f"{key}="
    if option.startswith("--"):
        option = "--" + option[2:].replace("_", "-")
    return option, inline


def _release_arity(option: str, release: ReleaseFlags | None) -> str | None:
    if release is None:
        return None
    flag = release.get(option)
    if flag is None:
        return None
    return {"switch": "switch", "bool": "switch", "value": "value", "list": "list"}[flag.arity]


def _refuse_unknown(option: str, release: ReleaseFlags | None) -> ServeArgsError:
    if release is not None:
        close = release.close(option)
        hint = f"closest: {', '.join(close)}" if close else "see `vllm serve --help` of that release"
        return ServeArgsError(f"vllm serve: flag {option[:60]} is not one vLLM {release.version} has; {hint}")
    known = sorted(o for o in (*_BY_OPTION, *NO_GPU_MEMORY) if o.startswith("--"))
    import difflib

    close = difflib.get_close_matches(option, known, n=3, cutoff=0.6)
    return ServeArgsError(f"vllm serve: flag {option[:60]} is not one the plan understands without a release"
                          + (f"; closest: {', '.join(close)}" if close else ""))  # fmt: skip


def parse_serve(argv: list[str], release: ReleaseFlags | None = None) -> tuple[str, DeploymentSpec, list[str]]:
    """(model, spec, ignored flags) from `vllm serve MODEL FLAGS` (the leading `vllm serve` may be left out)."""
    parsed = read_serve(argv, release)
    return parsed.model, parsed.spec, parsed.ignored


# The OpenAI server's module, run as `python -m ...`: the same engine and frontend flags as `vllm serve`, the model
# given with --model (entrypoints/openai/api_server.py; `vllm serve` runs it).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CONFIG_FILE_MAX_BYTES = 1 << 20
# vLLM's OpenAI server image, [REGISTRY/]vllm/vllm-openai[:TAG][@DIGEST]; group 1 the tag
VLLM_IMAGE = re.compile(r"(?:\S+/)?vllm-openai(?::([\w.+-]+))?(?:@\S+)?")
CONFIG_FILE_MAX_NODES = 100_000


def canonical_serve(argv: list[str]) -> list[str]:
    """The serve line as `vllm serve MODEL FLAGS`, however it was given (`vllm serve`, `serve`, nothing, or
    `python -m vllm.entrypoints.openai.api_server --model MODEL`): what `harness verify` starts and records."""
    words = _entry_words(list(argv))
    if words and not words[0].startswith("-"):
        return ["vllm", "serve", *words]
    for i, word in enumerate(words):
        if word == "--model" and i + 1 < len(words):
            return ["vllm", "serve", words[i + 1], *words[:i], *words[i + 2 :]]
        if word.startswith("--model="):
            return ["vllm", "serve", word.split("=", 1)[1], *words[:i], *words[i + 1 :]]
    pulled = _pull_config_file(words, [])  # the model a --config file names (vLLM takes it from there too)
    if pulled != words and "--model" in pulled[:-1]:
        return ["vllm", "serve", pulled[pulled.index("--model") + 1], *words]
    return ["vllm", "serve", *words]


def split_env(words: list[str]) -> tuple[list[str], list[str]]:
    """(the words but the harness's `--env NAME=VALUE` ones, those NAME=VALUE assignments): vLLM has no --env flag,
    the assignments are the environment it runs in."""
    env: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(words):
        if words[i] == "--env" and i + 1 < len(words):
            env.append(words[i + 1])
            i += 2
            continue
        if words[i].startswith("--env="):
            env.append(words[i][len("--env=") :])
        else:
            rest.append(words[i])
        i += 1
    return rest, env


def shell_line(words: list[str]) -> str:
    """The serve line as a shell runs it: the `--env NAME=VALUE` words as the command's environment
    (`NAME=VALUE vllm serve ...`)."""
    rest, env = split_env(words)
    return shlex.join([*env, *rest])


def image_release(argv: list[str]) -> str | None:
    """X.Y.Z of a `docker run ... vllm/vllm-openai:vX.Y.Z ...` line's image tag (the release the container runs), or
    None (no image, or a tag such as `latest` that names none)."""
    if argv[:1] not in (["docker"], ["podman"]) or argv[1:2] != ["run"]:
        return None
    tag = next((m.group(1) for w in argv if (m := VLLM_IMAGE.fullmatch(w))), None)
    match = re.fullmatch(r"v?(\d{1,3}\.\d{1,3}\.\d{1,3})(?:[-+][\w.]*)?", tag or "")
    return match.group(1) if match else None


def _entry_words(words: list[str]) -> list[str]:
    """The words after the entry point (below), with the shell's environment assignments before it
    (`VLLM_USE_DEEP_GEMM=1 vllm serve ...`, `env NAME=VALUE ...`) as `--env NAME=VALUE` words after them."""
    env: list[str] = []
    if words[:1] == ["env"]:
        words = words[1:]
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,80}=.{0,200}", words[0]):
        if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            env += ["--env", words[0]]
        words = words[1:]
    return [*_after_entry(words), *env]


def _after_entry(words: list[str]) -> list[str]:
    """The words after the entry point: `vllm serve`, `serve`, `python -m vllm.entrypoints.openai.api_server`, or
    `docker run [OPTIONS] IMAGE` of vLLM's OpenAI server image (its entrypoint is one of those; the words after the
    image are its arguments) (or none of them)."""
    if words[:1] in (["docker"], ["podman"]) and words[1:2] == ["run"]:
        image = next((i for i, w in enumerate(words) if VLLM_IMAGE.fullmatch(w)), None)
        if image is None:
            raise ServeArgsError(f"vllm serve: `{words[0]} run` of an image that is not vLLM's OpenAI server; allowed: "
                                 "a vllm/vllm-openai image and its arguments, or `vllm serve MODEL ...`")  # fmt: skip
        env = []  # the container's vLLM environment (-e/--env NAME=VALUE) as the serve line's --env
        for i, word in enumerate(words[2:image], 2):
            given = words[i + 1] if word in ("-e", "--env") and i + 1 < image else \
                word.split("=", 1)[1] if word.startswith("--env=") else ""  # fmt: skip
            if re.fullmatch(r"VLLM_[A-Z0-9_]{1,80}=.{0,200}", given):
                env += ["--env", given]
        words = words[image + 1 :]
        return [*(words[2:] if words[:2] == ["vllm", "serve"] else words), *env]
    if words[:2] == ["vllm", "serve"]:
        return words[2:]
    if words[:1] == ["serve"]:
        return words[1:]
    if words[:1] == ["vllm"]:
        raise ServeArgsError("vllm serve: only `vllm serve MODEL ...` is read; got `vllm "
                             f"{' '.join(words[1:2])[:30]}`")  # fmt: skip
    if len(words) >= 3 and re.fullmatch(r"(\S*/)?python(3(\.\d+)?)?", words[0]) and words[1] == "-m":
        if words[2] != API_SERVER_MODULE:
            raise ServeArgsError(f"vllm serve: python -m {words[2][:60]} is not read; allowed: `vllm serve MODEL ...` "
                                 f"or `python -m {API_SERVER_MODULE} --model MODEL ...`")  # fmt: skip
        return words[3:]
    return words


def read_serve(argv: list[str], release: ReleaseFlags | None = None) -> Parsed:
    words = _entry_words(list(argv))
    approximate: list[str] = []
    words = _pull_config_file(words, approximate)
    values: dict[str, object] = {}
    ignored: list[str] = []
    env: dict[str, str] = {}
    model_tag: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or re.fullmatch(r"-\d+", word):
            if model_tag is None:
                model_tag = word
                continue
            raise ServeArgsError(f"vllm serve: unexpected word {word[:60]!r} (one MODEL only)")
        option, inline = _normalize(word)
        if option == "--env":
            text = inline if inline is not None else (words[i] if i < len(words) else "")
            i += inline is None
            match = re.fullmatch(r"([A-Z_][A-Z0-9_]{0,80})=(.{0,200})", text)
            if match is None:
                raise ServeArgsError(f"vllm serve: --env {text[:40]!r}: allowed: NAME=VALUE")
            env[match.group(1)] = match.group(2)
            continue
        if option == "-O" and release is not None and release.optimization_flag:
            option = release.optimization_flag
        elif option == "-O":
            option = "--optimization-level"
        modelled = _BY_OPTION.get(option)
        negated = option.startswith("--no-") and _BY_OPTION.get("--" + option[5:]) is not None
        in_release = release is None or release.get(option) is not None
        if release is not None and not in_release:
            raise _refuse_unknown(option, release)
        arity = _release_arity(option, release) or (modelled.arity if modelled else None)
        if arity is None:
            if option in NO_GPU_MEMORY:
                arity = "value" if inline is not None or (i < len(words) and not words[i].startswith("-")
                                                          and option not in _SWITCHES) else "switch"  # fmt: skip
            else:
                raise _refuse_unknown(option, release)
        value: object = True
        if arity == "value":
            if inline is None:
                if i >= len(words):
                    raise ServeArgsError(f"vllm serve: {option} needs a value")
                inline = words[i]
                i += 1
            value = inline
        elif arity == "list":
            items = [inline] if inline is not None else []
            while i < len(words) and not words[i].startswith("-"):
                items.append(words[i])
                i += 1
            if not items:
                raise ServeArgsError(f"vllm serve: {option} needs one or more values")
            value = items
        if negated:
            values[_BY_OPTION["--" + option[5:]].dest] = False
            continue
        if modelled is not None:
            if modelled.arity == "list" or arity == "list":
                values[modelled.dest] = value if isinstance(value, list) else [value]
                continue
            try:
                values[modelled.dest] = modelled.convert(value) if isinstance(value, str) else value
            except ValueError as error:
                raise ServeArgsError(f"vllm serve: {option} {error}") from None
            continue
        if _neutral(option, release):
            ignored.append(option)
        else:
            declared = release.get(option) if release is not None else None
            ref = declared.ref if declared is not None else "the release"
            approximate.append(f"{option} is not sized (it may change GPU memory; {ref})")
    return _spec(values, model_tag, ignored, approximate, env, release)


def _pull_config_file(words: list[str], approximate: list[str]) -> list[str]:
    """`--config FILE` as FlexibleArgumentParser reads it (utils/argparse_utils.py _pull_args_from_config,
    load_config_file): the YAML file's `key: value` pairs become `--key value` (true: `--key`, false: nothing; a list
    its items; a mapping its JSON), placed after the model and before the other flags, so a flag given on the line
    wins. Only the exact word `--config` is pulled (`--config=FILE` is not, there either). A file not on this
    machine leaves the plan approximate: its flags are not read."""
    if "--config" not in words:
        return words
    if words.count("--config") > 1:
        raise ServeArgsError("vllm serve: --config is given more than once; vLLM reads one config file")
    index = words.index("--config")
    if index == len(words) - 1:
        raise ServeArgsError("vllm serve: --config needs a value (a .yaml or .yml file of flags)")
    name = words[index + 1]
    shown = name[:80]
    if name.rsplit(".", 1)[-1] not in ("yaml", "yml"):
        raise ServeArgsError(f"vllm serve: --config {shown}: vLLM reads a .yaml or .yml file of flags")
    rest = words[:index] + words[index + 2 :]
    path = Path(name).expanduser()
    if not path.is_file():
        approximate.append(f"--config {shown} is not on this machine: the flags it holds are not read")
        return rest
    try:
        if path.stat().st_size > CONFIG_FILE_MAX_BYTES:
            raise ServeArgsError(f"vllm serve: --config {shown}: larger than {CONFIG_FILE_MAX_BYTES} B; "
                                 "a config file of flags is a few lines")  # fmt: skip
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ServeArgsError(f"vllm serve: --config {shown}: not a readable YAML file "
                             f"({type(error).__name__})") from None  # fmt: skip
    if not isinstance(data, dict):
        raise ServeArgsError(f"vllm serve: --config {shown}: holds {type(data).__name__}; allowed: a mapping of "
                             "flag: value")  # fmt: skip
    if _nodes(data, CONFIG_FILE_MAX_NODES) > CONFIG_FILE_MAX_NODES:  # YAML aliases can nest a small file deep
        raise ServeArgsError(f"vllm serve: --config {shown}: more than {CONFIG_FILE_MAX_NODES} values once its "
                             "aliases are expanded; a config file of flags is a few lines")  # fmt: skip
    pulled: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,80}", key):
            raise ServeArgsError(f"vllm serve: --config {shown}: key {str(key)[:40]!r} is not a flag name")
        pulled += flag_words(f"--{key}", value)
    if rest and not rest[0].startswith("-"):
        return [rest[0], *pulled, *rest[1:]]
    return [*pulled, *rest]


def flag_words(flag: str, value: object, *, false_flag: str | None = None) -> list[str]:
    """A flag and its value as argparse words: true the switch alone, false nothing (or `false_flag`), a list its
    items (empty: nothing), a mapping its JSON, anything else its text (load_config_file's rules)."""
    if isinstance(value, bool):
        return [flag] if value else [false_flag] if false_flag else []
    if isinstance(value, list | tuple):
        return [flag, *(str(v) for v in value)] if value else []
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def _nodes(value: object, limit: int) -> int:
    """How many values `value` holds, nested (aliases counted each time they appear), counting stopped past limit."""
    count, stack = 0, [value]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return count


_SWITCHES = frozenset({"--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
                       "--enable-auto-tool-choice",
                       "--enable-prefix-caching", "--enable-chunked-prefill", "--headless",
                       "--disable-uvicorn-access-log", "--enable-log-requests", "--enable-log-outputs",
                       "--async-scheduling", "--disable-custom-all-reduce", "--grpc", "--enable-sleep-mode",
                       "--data-parallel-hybrid-lb", "--data-parallel-external-lb", "--disable-chunked-mm-input",
                       "--enable-eplb-log-balancedness", "--ray-workers-use-nsight", "--use-tqdm-on-load",
                       "--aggregate-engine-logging", "--skip-tokenizer-init"})  # fmt: skip


def _neutral(option: str, release: ReleaseFlags | None) -> bool:
    base = "--" + option[5:] if option.startswith("--no-") else option
    if base in NO_GPU_MEMORY:
        return True
    flag = release.get(option) if release is not None else None
    # the frontend's flags (host, ports, TLS, CORS, parsers, ...) never reach a worker
    return flag is not None and flag.ref.startswith("entrypoints/")


def _spec(values: dict[str, object], model_tag: str | None, ignored: list[str], approximate: list[str],
          env: dict[str, str], release: ReleaseFlags | None) -> Parsed:  # fmt: skip
    given = values.pop("model", None)
    model = given or model_tag
    if model is None:
        raise ServeArgsError("vllm serve: no MODEL given; allowed: a model directory holding config.json or a preset")
    if given and model_tag and given != model_tag:
        raise ServeArgsError(f"vllm serve: MODEL {model_tag[:60]} and --model {str(given)[:60]} differ")
    _check_choices(values, release)
    redundant = values.pop("num_redundant_experts", None)
    eplb = values.pop("eplb_config", None)
    if eplb is not None:
        redundant = _eplb_redundant(str(eplb), redundant)  # type: ignore[arg-type]
    fields: dict[str, object] = {k: v for k, v in values.items() if k in DeploymentSpec.model_fields}
    fields["num_redundant_experts"] = redundant
    _max_model_len(values, fields)
    _kv_dtype(values, fields, approximate)
    _graphs(values, fields, approximate, release)
    _other_memory_flags(values, fields, approximate, ignored)
    for name, value in env.items():
        if name == "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS":
            continue  # read by the caller (harness.sizing.deployment_plan)
        if name == "VLLM_MOE_DP_CHUNK_SIZE":
            try:
                fields["moe_dp_chunk_size"] = _positive(value)
            except ValueError as error:
                raise ServeArgsError(f"vllm serve: --env {name} {error}") from None
            continue
        if name == "VLLM_ALL2ALL_BACKEND" and release is not None and release.get("--all2all-backend") is None:
            # the releases before --all2all-backend choose the all-to-all from this variable (envs.py)
            if value not in ALL2ALL_BACKENDS:
                raise ServeArgsError(f"vllm serve: --env {name}={value[:30]}: allowed: {', '.join(ALL2ALL_BACKENDS)}")
            fields.setdefault("all2all_backend", value)
            continue
        if name in ENV_APPROXIMATE:
            approximate.append(f"--env {name}={value[:20]} is not sized")
    fields["approximate"] = approximate
    try:
        spec = DeploymentSpec(model=str(model), **fields)  # type: ignore[arg-type]
    except ValidationError as error:
        first = error.errors()[0]
        field = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "vllm serve"
        raise ServeArgsError(f"vllm serve: {field} {str(first.get('input'))[:40]}: {first['msg']}") from None
    if spec.num_redundant_experts and not spec.enable_eplb:
        raise ServeArgsError(f"vllm serve: num_redundant_experts {spec.num_redundant_experts} needs --enable-eplb "
                             "(vLLM refuses it otherwise, config/parallel.py)")  # fmt: skip
    return Parsed(model=str(model), spec=spec, ignored=ignored, env=env)


def _check_choices(values: dict[str, object], release: ReleaseFlags | None) -> None:
    for option, dest, fallback in (("--all2all-backend", "all2all_backend", ALL2ALL_BACKENDS),
                                   ("--moe-backend", "moe_backend", None),
                                   ("--kv-cache-dtype", "kv_cache_dtype", None),
                                   ("--dtype", "dtype", None)):  # fmt: skip
        value = values.get(dest)
        if value is None:
            continue
        allowed = release.choices(option) if release is not None else fallback
        if allowed and value not in allowed:
            raise ServeArgsError(f"vllm serve: {option} {str(value)[:40]}: allowed"
                                 f"{f' in vLLM {release.version}' if release is not None else ''}: "
                                 f"{', '.join(allowed)}")  # fmt: skip


def _max_model_len(values: dict[str, object], fields: dict[str, object]) -> None:
    text = values.get("max_model_len")
    if text is None:
        return
    if str(text).strip().lower() in ("auto", "-1"):
        fields["max_model_len"] = None
        fields["max_model_len_auto"] = True
        return
    try:
        fields["max_model_len"] = _size(str(text))
    except ValueError as error:
        raise ServeArgsError(f"vllm serve: --max-model-len {error}; or auto / -1") from None


def _kv_dtype(values: dict[str, object], fields: dict[str, object], approximate: list[str]) -> None:
    value = values.get("kv_cache_dtype")
    if value is None:
        return
    known = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
    if value in known:
        fields["kv_cache_dtype"] = value
    elif str(value).startswith("fp8"):
        fields["kv_cache_dtype"] = "fp8"
        approximate.append(f"--kv-cache-dtype {value}: sized as 1-byte fp8 (its scales are not)")
    elif value == "float16":
        fields["kv_cache_dtype"] = "bfloat16"  # two bytes either way
    else:
        fields["kv_cache_dtype"] = "auto"
        approximate.append(f"--kv-cache-dtype {value}: sized in the model's dtype")


def _graphs(values: dict[str, object], fields: dict[str, object], approximate: list[str],
            release: ReleaseFlags | None) -> None:  # fmt: skip
    """-O / --optimization-level and --compilation-config: whether CUDA graphs are captured at all (modelled),
    other graph settings (capture sizes, piecewise vs full) change the graph pool (approximate)."""
    level = values.get("optimization_level")
    if level is not None:
        text = str(level).strip()
        old = release is not None and release.optimization_flag == "--compilation-config"
        if text in ("0",) and not old:
            fields["cudagraphs"] = False  # config/vllm.py OPTIMIZATION_LEVEL_00: cudagraph_mode NONE
        elif text in ("2", "3") and not old:
            pass  # the default level's graphs (-O2; -O3 is the same)
        else:
            approximate.append(f"-O{text}: its CUDA-graph mode's memory is not sized")
    config = values.get("compilation_config")
    if config is not None:
        settings = _compilation_settings(str(config))
        mode = str(settings.get("cudagraph_mode", "")).upper()
        if mode == "NONE" or settings.get("level") in (0, "0") or settings.get("mode") in (0, "0", "NONE", "none"):
            if mode == "NONE":
                fields["cudagraphs"] = False
            else:
                approximate.append("--compilation-config without compilation: its CUDA graphs are not sized")
        else:
            _graph_settings(settings, fields, approximate, "--compilation-config ")
    _graph_settings({k: values[k] for k in ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
                     if values.get(k) is not None}, fields, approximate, "--")  # fmt: skip


def _graph_settings(settings: dict[str, object], fields: dict[str, object], approximate: list[str],
                    where: str) -> None:  # fmt: skip
    """cudagraph_mode, max_cudagraph_capture_size and cudagraph_capture_sizes into the spec (the CUDA-graph
    estimate counts the graphs from them: harness.sizing.cudagraph_memory)."""
    from harness.scenario.deployment import CUDAGRAPH_MODES

    mode = settings.get("cudagraph_mode")
    if mode is not None:
        text = str(mode).upper()
        if text not in CUDAGRAPH_MODES:
            raise ServeArgsError(f"vllm serve: {where}cudagraph_mode {str(mode)[:30]!r} is not one of "
                                 f"{', '.join(CUDAGRAPH_MODES)}")  # fmt: skip
        fields["cudagraph_mode"] = text
    if settings.get("full_cuda_graph"):
        approximate.append(f"{where}full_cuda_graph: the older spelling of FULL graphs is not sized")

    def name(key: str) -> str:
        return f"{where}{key.replace('_', '-')}" if where == "--" else f"{where}{key}"

    largest = settings.get("max_cudagraph_capture_size")
    if largest is not None:
        fields["max_cudagraph_capture_size"] = _positive_int(largest, name("max_cudagraph_capture_size"))
    sizes = settings.get("cudagraph_capture_sizes")
    if sizes is not None:
        text = " ".join(map(str, sizes)) if isinstance(sizes, list) else str(sizes)
        items = [v for v in re.split(r"[,\s\[\]]+", text) if v]
        if not items:
            raise ServeArgsError(f"vllm serve: {name('cudagraph_capture_sizes')} is empty; give positive integers")
        fields["cudagraph_capture_sizes"] = [_positive_int(v, name("cudagraph_capture_sizes")) for v in items]


def _positive_int(value: object, name: str) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"\d{1,8}", text) or int(text) <= 0:
        raise ServeArgsError(f"vllm serve: {name} {text[:30]!r} is not a positive integer")
    return int(text)


def _compilation_settings(text: str) -> dict[str, object]:
    """--compilation-config '{...}', a level (old releases: -O3 is --compilation-config 3), or key=value (the
    dotted form)."""
    text = text.strip()
    if re.fullmatch(r"\d", text):
        return {"level": int(text)}
    if "=" in text and not text.startswith("{"):
        key, _, value = text.partition("=")
        return {key.strip(): value.strip()}
    try:
        from harness.sizing.model_config import loads_bounded

        data = loads_bounded(text, what="--compilation-config")
    except ValueError:
        raise ServeArgsError(f"vllm serve: --compilation-config {text[:60]!r} is not JSON") from None
    if not isinstance(data, dict):
        raise ServeArgsError(f"vllm serve: --compilation-config {text[:60]!r} is not a JSON object")
    return data


def _other_memory_flags(values: dict[str, object], fields: dict[str, object], approximate: list[str],
                        ignored: list[str]) -> None:  # fmt: skip
    if values.get("limit_mm_per_prompt") is not None:
        # the counts per modality; multimodal models build a tower only for modalities above 0 (weights sizing)
        fields["limit_mm_per_prompt"] = _mm_limits(str(values["limit_mm_per_prompt"]))
    if values.get("language_model_only"):
        fields["language_model_only"] = True
    if values.get("disable_hybrid_kv_cache_manager"):
        ignored.append("--disable-hybrid-kv-cache-manager")  # full attention in every layer: one KV group either way
    if values.get("calculate_kv_scales"):
        approximate.append("--calculate-kv-scales: the first forward's scale computation is not sized")
    if values.get("num_gpu_blocks_override") is not None:
        approximate.append("--num-gpu-blocks-override: the KV cache's blocks are set, not sized")
    for dest in ("dtype", "quantization"):
        if values.get(dest) is not None:
            fields[dest] = values[dest]  # routed to the weights' sizing (harness.sizing.deployment.resolve)


def _mm_limits(text: str) -> dict[str, int]:
    """--limit-mm-per-prompt '{"image": 0, "video": {"count": 1, ...}}': the count per modality, as 0.26.0's
    config/multimodal.py MultiModalConfig._validate_limit_per_prompt reads it (an int is the legacy count form; an
    object carries `count`, 999 where left out: BaseDummyOptions.count)."""
    from harness.sizing.model_config import loads_bounded

    allowed = "a JSON object of modality: count (e.g. '{\"image\": 0}'), or the dotted --limit-mm-per-prompt.image=0"
    text = text.strip()
    if "=" in text and not text.startswith("{"):  # the dotted form (_normalize): --limit-mm-per-prompt.image=0
        key, _, value = text.partition("=")
        text = f'{{"{key.strip()[:40]}": {value.strip()[:20] or "null"}}}'
    try:
        data = loads_bounded(text, what="--limit-mm-per-prompt")
    except ValueError:
        raise ServeArgsError(f"vllm serve: --limit-mm-per-prompt {text[:60]!r} is not JSON; allowed: "
                             f"{allowed}") from None  # fmt: skip
    if not isinstance(data, dict) or not data or len(data) > 16:
        raise ServeArgsError(f"vllm serve: --limit-mm-per-prompt {text[:60]!r}; allowed: {allowed}")
    limits: dict[str, int] = {}
    for modality, value in data.items():
        count = value.get("count", 999) if isinstance(value, dict) else value
        if not re.fullmatch(r"[a-z_]{1,40}", str(modality)) or type(count) is not int or count < 0:
            raise ServeArgsError(f"vllm serve: --limit-mm-per-prompt {str(modality)[:40]!r}: {str(value)[:40]!r}; "
                                 f"allowed: {allowed}, counts >= 0")  # fmt: skip
        limits[str(modality)] = count
    return limits


def _eplb_redundant(text: str, older: int | None) -> int | None:
    from harness.sizing.model_config import loads_bounded

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
        raise ServeArgsError(
            f"vllm serve: --eplb-config num_redundant_experts {str(value)[:20]} is not an integer >= 0"
        )
    if older is not None and value != older:
        raise ServeArgsError(f"vllm serve: --num-redundant-experts {older} and --eplb-config's {value} differ")
    return value
