"""`harness verify [--entry serve|llm] [--log FILE] [--tolerance-pct P] -- vllm serve MODEL FLAGS`

Without --log: starts that vLLM (installed for --python) on dummy weights, reads what it printed, and puts
`harness plan`'s prediction for the installed release beside it. With --log FILE: the same from a startup log the
user already has; nothing is started (CPU only).

Exit codes: 0 every judged line within --tolerance-pct; 1 a line outside it, or vLLM did not start where the plan
says it does (vLLM's own error line is printed); 2 bad input, no vLLM to start, or what cannot be started here.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from harness.core.errors import BadInput
from harness.core.exits import EXIT_FAILED, EXIT_OK

log = logging.getLogger(__name__)

MAX_TIMEOUT_S = 24 * 3600


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    serve: tuple[str, ...]
    log: Path | None = None
    entry: str = "serve"
    tolerance_pct: float = 1.0
    timeout_s: float = 900.0
    python: str = sys.executable
    vllm_version: str | None = None
    gpu: str | None = None
    cache_dir: Path | None = None
    save: Path | None = None
    keep_log: Path | None = None
    json: bool = False


def _error(message: str) -> NoReturn:
    """Refuse in one line: harness.cli.main shows it and exits 2."""
    raise BadInput(message)


def verify_command(request: VerifyRequest) -> int:
    from harness.sizing.model_config import ModelConfigError, load_model
    from harness.sizing.serve_args import ServeArgsError, canonical_serve, parse_serve

    if not 0 <= request.tolerance_pct <= 100:
        return _error(f"--tolerance-pct {request.tolerance_pct} is not a percentage; allowed: 0 to 100")
    if not 0 < request.timeout_s <= MAX_TIMEOUT_S:
        return _error(f"--timeout {request.timeout_s} is not a number of seconds; allowed: above 0, at most "
                      f"{MAX_TIMEOUT_S}")  # fmt: skip
    from harness.scenario.sections import GPU_MEMORY_BYTES

    if request.gpu is not None and request.gpu not in GPU_MEMORY_BYTES:
        return _error(f"--gpu {request.gpu[:40]!r} is not a known GPU; allowed: {', '.join(GPU_MEMORY_BYTES)}")
    if request.entry not in ("serve", "llm"):
        return _error(f"--entry {request.entry[:20]!r}; allowed: serve, llm")
    given = list(request.serve)
    if not given and request.log is not None:
        given = _serve_from_log(request.log)
    if not given:
        return _error("verify needs `-- vllm serve MODEL FLAGS` after the options; see `harness verify --help`")
    try:
        serve = canonical_serve(given)
        model, spec, _ = parse_serve(serve)
        facts = load_model(model)
    except (ServeArgsError, ModelConfigError) as error:
        return _error(str(error))
    if request.log is not None:
        return _from_log(request, serve)
    return _from_start(request, serve, model, spec, facts)


def _serve_from_log(path: Path) -> list[str]:
    """The serve line the log's `non-default args` give (vllm serve prints them), or [] where it has none."""
    from harness.verify.logparse import ServeLineError, serve_line_from_log

    text = _read_log(path)
    if isinstance(text, int):
        return []
    try:
        words = serve_line_from_log(text)
    except ServeLineError as error:
        return _error(f"--log {path.name}: {error}")
    if words is None:
        return _error(f"--log {path.name}: the log prints no `non-default args` line to read the serve line from; "
                      "give it after `--`")  # fmt: skip
    log.info(f"the serve line from the log's non-default args: {' '.join(words)[:400]}")
    return words


def _read_log(path: Path) -> str | int:
    from harness.verify.logparse import MAX_LOG_BYTES

    try:
        if not path.is_file():
            return _error(f"--log {path}: no such file")
        if path.stat().st_size > MAX_LOG_BYTES:
            return _error(f"--log {path}: {path.stat().st_size} bytes; allowed: a startup log of at most 256 MiB")
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        return _error(f"--log {path}: {error.strerror or error}")


def _config_only(serve: list[str]) -> str:
    """'; a config directory holding only config.json' when the served model is a directory without safetensors:
    the record's plan then builds what vLLM builds from such a directory (harness.verify.planning.record_facts)."""
    from harness.sizing.model_config import holds_safetensors
    from harness.sizing.serve_args import parse_serve
    from harness.verify.planning import CONFIG_ONLY

    model = Path(parse_serve(serve)[0])
    if model.is_dir() and not holds_safetensors(model):
        return f"; {CONFIG_ONLY}"
    return ""


def _record(request: VerifyRequest, serve: list[str], text: str, *, source: str, status: str | None = None,
            seconds: float | None = None, version: str | None = None):  # fmt: skip
    from harness.verify.logparse import parse_log
    from harness.verify.planning import gpu_from_total
    from harness.verify.record import StartupRecord, StartupSettings

    parsed = parse_log(text)
    release = request.vllm_version or version or parsed.vllm_version
    gpu = request.gpu or gpu_from_total(parsed.figures.gpu_total_gib) or "unknown"
    entry = request.entry if request.log is None or request.entry == "llm" else \
        ("llm" if parsed.usage_context == "LLM_CLASS" else "serve")  # fmt: skip
    settings = StartupSettings(max_num_batched_tokens=parsed.defaults.get("max_num_batched_tokens"),
                               max_num_seqs=parsed.defaults.get("max_num_seqs"))  # fmt: skip
    record = StartupRecord(
        schema_version=2, source=source, vllm_version=release or "unknown", gpu=gpu,
        model=serve[2] if serve[:2] == ["vllm", "serve"] else serve[0], serve=serve, settings=settings,
        figures=parsed.figures, entry=entry, model_runner=parsed.model_runner,  # type: ignore[arg-type]
        backends=parsed.backends, key_lines=parsed.key_lines, startup_s=seconds,
        status=status or ("ready" if parsed.ready else "failed"), error=parsed.error,  # type: ignore[arg-type]
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
    return record, parsed, release


def _from_log(request: VerifyRequest, serve: list[str]) -> int:
    assert request.log is not None
    text = _read_log(request.log)
    if isinstance(text, int):
        return text
    record, parsed, release = _record(request, serve, text, source=f"a startup log ({request.log.name})")
    if release is None:
        return _error(
            f'--log {request.log}: the log names no vLLM release ("Initializing a V1 LLM engine (vX.Y.Z)"); '
            "give --vllm-version X.Y.Z"
        )
    if not parsed.found:
        return _error(f"--log {request.log}: no startup figure of vLLM's in it (\"Model loading took\", \"Available "
                      "KV cache memory\", ...); is it a vLLM startup log?")  # fmt: skip
    return _judge(request, record, release)


def _from_start(request: VerifyRequest, serve: list[str], model: str, spec, facts) -> int:
    from harness.sizing.serve_args import split_env
    from harness.verify.launch import (
        LaunchError,
        command,
        gpu_count,
        gpu_name,
        installed_vllm,
        launch,
    )

    release = installed_vllm(request.python)
    if release is None:
        return _error(
            f"no vLLM installed for {request.python} (its package metadata names none): `harness verify` "
            "starts the operator's own vLLM; --log FILE compares a startup log without starting anything"
        )
    if request.vllm_version and request.vllm_version != release:
        return _error(f"--vllm-version {request.vllm_version}: the vLLM installed for {request.python} is "
                      f"{release}; a startup verifies the installed release")  # fmt: skip
    gpus, name = gpu_count()
    tp, dp = spec.tensor_parallel_size, spec.data_parallel_size or 1
    flags = serve[3:]
    note = ""
    if gpus == 0:
        return _error("no NVIDIA GPU visible (nvidia-smi lists none): vLLM cannot start here; --log FILE compares a "
                      "startup log from the deployment's machine")  # fmt: skip
    if tp > gpus:
        return _error(f"TP {tp} needs {tp} GPUs and this machine shows {gpus}: one rank's worth of a TP group cannot "
                      "start alone (each rank holds 1/TP of every layer and runs collectives with its peers); compare "
                      "a log from the deployment with --log FILE")  # fmt: skip
    if dp > 1:
        if facts.is_moe:
            return _error(f"DP {dp} with an MoE model: one DP rank's experts (1/{tp * dp} of them under EP, or 1/"
                          f"{tp * dp} of each expert without) exist only beside their peers, so vLLM cannot start "
                          "one rank's worth here; compare a log from the deployment with --log FILE")  # fmt: skip
        if tp * dp > gpus:
            flags = _without_dp(flags)
            serve = [*serve[:3], *flags]
            note = (
                f"DP {dp}: each DP rank of a dense model is an engine of its own; one rank's worth (TP {tp}) is "
                "started here and planned at DP 1 (the DP ranks' NCCL buffers are not part of it)"
            )
    gpu = request.gpu or gpu_name(name)
    flags, assignments = split_env(flags)
    environment = dict(a.partition("=")[::2] for a in assignments)
    with tempfile.TemporaryDirectory(prefix="harness-verify-") as tmp:
        log_path = Path(tmp) / "vllm.log"
        try:
            argv = command(request.python, request.entry, _model_dir(model, facts.path, Path(tmp)), flags)
        except LaunchError as error:
            return _error(str(error))
        log.info(f"starting vLLM {release} ({'vllm serve' if request.entry == 'serve' else 'the LLM class'}, dummy "
                 f"weights) on {name}; at most {request.timeout_s:.0f} s")  # fmt: skip
        if note:
            log.info(note)
        launched = launch(argv, log_path, request.timeout_s, env=environment)
        if request.keep_log is not None:
            request.keep_log.write_text(launched.log)
    request = VerifyRequest(**{**request.__dict__, "gpu": gpu})
    record, parsed, _ = _record(
        request,
        serve,
        launched.log,
        source=f"harness verify ({request.entry} entry)" + _config_only(serve),
        status=launched.status,
        seconds=round(launched.seconds, 1),
        version=release,
    )
    if launched.status == "timeout" and not parsed.ready:
        print(f"vLLM did not finish starting within {request.timeout_s:.0f} s (stopped, with its process group)"
              + (f"; its last error: {parsed.error}" if parsed.error else ""))  # fmt: skip
        _save(request, record)
        return EXIT_FAILED
    return _judge(request, record, release)


def _model_dir(model: str, config_path: str, tmp: Path) -> str:
    """What vLLM is started from: the directory given, or the snapshot directory of a hub id in the local Hugging Face
    cache, or for a preset (by name, hub id, or the name of a path not on this machine) a directory holding its config
    facts as config.json (vLLM builds the model from them; the dummy weights need nothing else). config_path: the
    loaded model's config (ModelFacts.path)."""
    import json

    from harness.sizing.model_config import MODELS_DIR, PRESET_SHOWN

    if Path(model).is_dir():
        return model
    preset = MODELS_DIR / Path(config_path).name
    if not (config_path == PRESET_SHOWN.format(preset.stem) and preset.is_file()):
        return str(Path(config_path).parent)  # a snapshot's config.json
    data = {k: v for k, v in json.loads(preset.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    directory = tmp / preset.stem
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return str(directory)


def _without_dp(flags: list[str]) -> list[str]:
    out, skip = [], False
    for word in flags:
        if skip:
            skip = False
            continue
        if word in ("--data-parallel-size", "-dp"):
            skip = True
            continue
        if word.startswith("--data-parallel-size="):
            continue
        out.append(word)
    return out


def _save(request: VerifyRequest, record) -> None:
    if request.save is not None:
        from harness.verify.record import dump_record

        request.save.write_text(dump_record(record, "A vLLM startup as `harness verify` read it"))


def _judge(request: VerifyRequest, record, release: str) -> int:
    from harness.sizing.model_config import ModelConfigError
    from harness.sizing.vllm_source.sources import VllmSourceError
    from harness.verify.compare import compare, header, outside, report
    from harness.verify.planning import gpu_from_total, plan_record

    _save(request, record)
    gpu = request.gpu or gpu_from_total(record.figures.gpu_total_gib)
    try:
        plan = plan_record(record, version=release, gpu=gpu, cache_dir=request.cache_dir, release=True)
    except (ModelConfigError, VllmSourceError) as error:
        return _error(str(error))
    rows = compare(record, plan, request.tolerance_pct)
    if request.json:
        print(report(record, plan, rows, request.tolerance_pct).model_dump_json(indent=1))
    else:
        entry = "vllm serve" if record.entry == "serve" else "the LLM class"
        runner = f", {record.model_runner.upper()} model runner" if record.model_runner else ""
        print(
            f"vLLM {release} ({entry}{runner}) against harness plan for {release}; tolerance {request.tolerance_pct}%"
        )
        print(header())
        for row in rows:
            print(row.text())
    bad = outside(rows)
    if not request.json:
        if record.status != "ready" and not record.figures.kv_cache_tokens:
            print(f"vLLM did not start: {record.error or 'no error line in its log'}")
        print(f"outside {request.tolerance_pct}%: {', '.join(r.name for r in bad)}" if bad else
              f"every judged line within {request.tolerance_pct}%")  # fmt: skip
    return EXIT_FAILED if bad else EXIT_OK
