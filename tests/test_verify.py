"""`harness verify`: a vLLM startup (or a log, --log) beside `harness plan`, line by line.

On CPU against committed logs: the key lines of the real startups in tests/data/real_startups and a published log's
format; the launcher's bounds (ready, failure, timeout, nothing left behind) with real child processes that print
what vLLM prints; bad input. A gpu-marked test starts real vLLM when it is importable.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from cli_utils import run_harness
from harness.verify.launch import flags_to_kwargs, launch
from harness.verify.logparse import llm_kwargs_to_serve, parse_log
from harness.verify.record import StartupRecord, load_record

DATA = Path(__file__).resolve().parent / "data"
REAL = DATA / "real_startups"


def _startup(tmp_path: Path, name: str) -> tuple[Path, list[str]]:
    """The startup's log (its key lines, as vLLM printed them) and the serve command over its config directory."""
    import json

    record = load_record(REAL / f"{name}.yaml")
    config = tmp_path / name
    config.mkdir()
    (config / "config.json").write_text(json.dumps(record.config))
    log = tmp_path / f"{name}.log"
    log.write_text("\n".join(f"(EngineCore pid=7) INFO 12-01 23:51:40 {line}" for line in record.key_lines) + "\n")
    assert record.llm_kwargs is not None
    return log, llm_kwargs_to_serve(str(config), record.llm_kwargs)


def test_every_startup_record_file_is_a_valid_record():
    """The published logs' files (version 1, no schema_version) and the real startups (version 2) load as one model."""
    files = sorted((DATA / "startup_logs").glob("*.yaml")) + sorted(REAL.glob("*.yaml"))
    records = [load_record(p) for p in files]
    assert len(records) >= 30
    assert {r.schema_version for r in records} == {1, 2}
    assert all(isinstance(r, StartupRecord) and r.figures.model_loading_gib for r in records)


def test_a_newer_or_broken_record_is_refused_with_one_line(tmp_path):
    from harness.verify.record import RecordError

    newer = tmp_path / "newer.yaml"
    newer.write_text((REAL / "llama-8b-4l.yaml").read_text().replace("schema_version: 2", "schema_version: 9"))
    with pytest.raises(RecordError, match="schema_version 9 is newer"):
        load_record(newer)
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (REAL / "llama-8b-4l.yaml").read_text().replace("kv_cache_tokens: 7920896", "kv_cache_tokens: many")
    )
    with pytest.raises(RecordError, match=r"figures\.kv_cache_tokens"):
        load_record(broken)


def test_the_parser_reads_vllm_0_26_lines():
    text = """INFO 12-01 23:51:05 [entrypoints/llm.py:343] Initializing a V1 LLM engine (v0.26.0) with config: ...
(EngineCore pid=2515) INFO 12-01 23:59:39 [v1/worker/gpu/model_runner.py:305] Model loading took 5.41 GiB and 1.56 seconds
(EngineCore pid=2515) DEBUG 12-01 23:59:44 [v1/worker/gpu_worker.py:559] Memory profiling takes 17.00 seconds. Total non KV cache memory: 6.38GiB; torch peak memory increase: 0.74GiB; non-torch forward increase memory: 0.22GiB; weights memory: 5.41GiB.
(EngineCore pid=2515) INFO 12-01 23:59:44 [v1/worker/gpu_worker.py:560] Available KV cache memory: 119.44 GiB
(EngineCore pid=2515) INFO 12-01 23:59:44 [v1/core/kv_cache_utils.py:2177] GPU KV cache size: 3,913,760 tokens
(EngineCore pid=2515) INFO 12-01 23:59:44 [v1/core/kv_cache_utils.py:2178] Maximum concurrency for 4,096 tokens per request: 955.51x
INFO 12-01 23:59:40 [config/scheduler.py:1] Defaulting max_num_batched_tokens to 16384 for LLM_CLASS usage context.
"""
    parsed = parse_log(text)
    f = parsed.figures
    assert (f.model_loading_gib, f.non_kv_gib, f.torch_peak_increase_gib, f.non_torch_increase_gib) == \
        (5.41, 6.38, 0.74, 0.22)  # fmt: skip
    assert (f.available_kv_cache_gib, f.kv_cache_tokens, f.max_model_len, f.max_concurrency) == \
        (119.44, 3913760, 4096, 955.51)  # fmt: skip
    assert f.cuda_graph_estimate_gib is None and parsed.model_runner == "v2" and parsed.ready
    assert parsed.vllm_version == "0.26.0"
    assert parsed.defaults == {"max_num_batched_tokens": 16384} and parsed.usage_context == "LLM_CLASS"


def test_the_parser_reads_the_breakdown_of_0_27_on():
    """From 0.27.0 (utils/mem_utils.py MemoryProfilingResult.__repr__) the breakdown prints the driver's total
    consumption in place of the non-torch increase: the non-KV total and the torch peak are read, the non-torch
    increase is left unset rather than derived from a total whose terms changed."""
    line = ("(EngineCore pid=9) DEBUG 12-01 23:59:44 [v1/worker/gpu_worker.py:640] Memory profiling takes 9.10 "
            "seconds. Total non KV cache memory: 18.42GiB; torch peak memory increase: 1.37GiB; total consumed "
            "(from mem_get_info): 17.20GiB; weights memory: 15.27GiB.\n")  # fmt: skip
    parsed = parse_log(line)
    f = parsed.figures
    assert (f.non_kv_gib, f.torch_peak_increase_gib, f.non_torch_increase_gib) == (18.42, 1.37, None)
    assert "breakdown_consumed" in parsed.found and any("total consumed" in k for k in parsed.key_lines)


def test_the_parser_names_vllms_own_error_for_a_failed_start():
    text = """(EngineCore pid=9) ERROR 12-01 23:59:44 [v1/engine/core.py:1] EngineCore failed to start.
(EngineCore pid=9) Traceback (most recent call last):
(EngineCore pid=9)   File "vllm/v1/worker/gpu_worker.py", line 400, in determine_available_memory
(EngineCore pid=9) ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
    parsed = parse_log(text)
    assert not parsed.ready
    assert parsed.error.startswith("ValueError: No available memory for the cache blocks")
    without = "\n".join(x for x in text.splitlines() if "Error:" not in x or "RuntimeError" in x)
    assert parse_log(without).error is None  # the generic lines name nothing
    logged = text.replace("EngineCore failed to start.", "Worker proc died: CUDA out of memory").replace(
        "ValueError", "X"
    )
    assert parse_log(logged).error == "[v1/engine/core.py:1] Worker proc died: CUDA out of memory"


@pytest.mark.vllm_wheel
def test_verify_log_within_tolerance_exits_0(tmp_path):
    log, serve = _startup(tmp_path, "qwen2.5-7b-4l")
    saved = tmp_path / "saved.yaml"
    result = run_harness("verify", "--entry", "llm", "--log", str(log), "--gpu", "H200-141GB", "--save", str(saved),
                         "--", *serve)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "vLLM 0.26.0 (the LLM class, V2 model runner) against harness plan for 0.26.0" in out
    for name in ("weights", "torch peak", "non-torch", "CUDA graphs", "KV GiB", "KV tokens", "concurrency",
                 "verdict", "attention"):  # fmt: skip
        assert f"\n{name}" in out, name
    assert "15,818,000" in out and "every judged line within 1.0%" in out
    record = load_record(saved)
    assert record.figures == load_record(REAL / "qwen2.5-7b-4l.yaml").figures and record.entry == "llm"


@pytest.mark.vllm_wheel
def test_verify_log_alone_reads_the_serve_line_from_its_non_default_args(tmp_path):
    """Without `-- vllm serve ...` the serve line is the log's `non-default args` (its model a directory here): the
    same judgement as with the line given. A value that is not a Python literal, or a log without the line, is
    refused in one line."""
    log, serve = _startup(tmp_path, "qwen2.5-7b-4l")
    given = run_harness("verify", "--log", str(log), "--gpu", "H200-141GB", "--", *serve, cwd=tmp_path)
    alone = run_harness("verify", "--log", str(log), "--gpu", "H200-141GB", cwd=tmp_path)
    assert alone.returncode == given.returncode == 0, alone.stdout + alone.stderr
    assert "the serve line from the log's non-default args: vllm serve qwen2.5-7b-4l --skip-tokenizer-init" in \
        alone.stderr  # fmt: skip
    assert alone.stdout == given.stdout and "15,818,000" in alone.stdout
    objects = tmp_path / "objects.log"
    objects.write_text("INFO 12-01 23:51:40 [api_utils.py:273] non-default args: {'model': 'qwen2.5-7b', "
                       "'attention_config': AttentionConfig(backend=None)}\n")  # fmt: skip
    bare = tmp_path / "bare.log"
    bare.write_text(log.read_text().replace("non-default args", "arguments"))
    for path, message in ((objects, "give attention_config as AttentionConfig(backend=None), not a literal"),
                          (bare, "the log prints no `non-default args` line")):  # fmt: skip
        result = run_harness("verify", "--log", str(path), cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.vllm_wheel
def test_verify_log_json_is_a_typed_report_and_the_gpu_follows_from_the_total(tmp_path):
    from harness.verify.compare import VerifyReport

    log, serve = _startup(tmp_path, "qwen3-8b-4l")
    result = run_harness("verify", "--entry", "llm", "--log", str(log), "--json", "--", *serve)
    assert result.returncode == 0, result.stderr
    got = VerifyReport.model_validate_json(result.stdout)
    assert got.schema_version == 1 and got.within and got.record.gpu == "H200-141GB" and got.plan.gpu == "H200-141GB"
    tokens = next(r for r in got.rows if r.name == "KV tokens")
    assert tokens.logged == 7899904 and tokens.predicted == got.plan.kv_tokens and tokens.within
    graphs = next(r for r in got.rows if r.name == "CUDA graphs")
    assert graphs.logged == 0.0 and graphs.predicted == 0.0  # the V2 runner: no estimate, in the log or the plan


@pytest.mark.vllm_wheel
def test_verify_log_outside_tolerance_exits_1_and_names_the_lines(tmp_path):
    log, serve = _startup(tmp_path, "llama-8b-4l")
    result = run_harness("verify", "--entry", "llm", "--log", str(log), "--gpu", "H200-141GB",
                         "--tolerance-pct", "0.005", "--", *serve)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "outside 0.005%: " in result.stdout and "KV tokens" in result.stdout.splitlines()[-1]


def test_verify_log_of_online_fp8_is_judged(tmp_path):
    """--quantization fp8 is sized (online FP8 of the bfloat16 checkpoint): the startup's lines are judged."""
    log, serve = _startup(tmp_path, "qwen3-moe-4l-online-fp8")
    result = run_harness("verify", "--log", str(log), "--", *serve)
    assert result.returncode == 0, result.stderr
    assert "every judged line within" in result.stdout


def test_verify_log_of_a_flag_the_plan_does_not_read_is_bad_input(tmp_path):
    log, serve = _startup(tmp_path, "qwen3-moe-4l-online-fp8")
    result = run_harness("verify", "--log", str(log), "--", *serve, "--no-such-flag", "4")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("harness: error: vllm serve: flag --no-such-flag is not one the plan understands")


def test_verify_log_of_a_flag_of_the_release_is_compared(tmp_path):
    """--quantization is a flag of the release: accepted and routed to the weights' sizing, so verify compares the
    startup line by line instead of refusing it (where the model facts do not size it, the weights line says so)."""
    log, serve = _startup(tmp_path, "qwen3-moe-4l-online-fp8")
    result = run_harness("verify", "--log", str(log), "--", *serve)
    assert result.returncode in (0, 1), result.stderr
    assert "harness: error" not in result.stderr
    assert any(line.startswith("weights ") for line in result.stdout.splitlines())


@pytest.mark.parametrize("args,message", [
    (["--tolerance-pct", "-1"], "--tolerance-pct -1.0 is not a percentage; allowed: 0 to 100"),
    (["--timeout", "0"], "--timeout 0.0 is not a number of seconds"),
    (["--log", "/nonexistent/vllm.log"], "--log /nonexistent/vllm.log: no such file"),
    (["--gpu", "H300"], "--gpu 'H300' is not a known GPU; allowed: A100-40GB"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run_harness("verify", *args, "--", "vllm", "serve", "qwen3-30b-a3b")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr and "Traceback" not in result.stderr


def test_a_log_without_vllm_figures_is_refused(tmp_path):
    log = tmp_path / "other.log"
    log.write_text("INFO 12-01 23:51:05 [x.py:1] Initializing a V1 LLM engine (v0.26.0) with config\nhello\n")
    result = run_harness("verify", "--log", str(log), "--", "vllm", "serve", "qwen3-30b-a3b")
    assert result.returncode == 2 and "no startup figure of vLLM's in it" in result.stderr


def test_no_serve_command_is_refused():
    result = run_harness("verify")
    assert result.returncode == 2 and "verify needs `-- vllm serve MODEL FLAGS`" in result.stderr
    result = run_harness("verify", "--log", "x.log")
    assert result.returncode == 2 and "--log x.log: no such file" in result.stderr


def test_without_vllm_installed_it_says_so_and_starts_nothing(tmp_path):
    """The Python given has no vLLM (this test environment's own has none installed as a package either way)."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    result = run_harness("verify", "--python", str(python), "--", "vllm", "serve", "qwen3-30b-a3b")
    assert result.returncode == 2
    assert f"no vLLM installed for {python}" in result.stderr and "--log FILE" in result.stderr


def test_flags_become_the_llm_classs_keyword_arguments():
    kwargs = flags_to_kwargs("m", ["--max-model-len", "4096", "--enforce-eager", "--gpu-memory-utilization=0.5",
                                   "--compilation-config", '{"cudagraph_mode":"PIECEWISE"}',
                                   "--kv-cache-dtype", "fp8"])  # fmt: skip
    assert kwargs == {"model": "m", "max_model_len": 4096, "enforce_eager": True, "gpu_memory_utilization": 0.5,
                      "compilation_config": {"cudagraph_mode": "PIECEWISE"}, "kv_cache_dtype": "fp8"}  # fmt: skip
    assert llm_kwargs_to_serve("m", {k: v for k, v in kwargs.items() if k != "model"})[3:5] == ["--max-model-len",
                                                                                                "4096"]  # fmt: skip


# --- the whole startup path, with a stand-in for the GPU machine ---------------------------------------------------

STAND_IN = """#!/bin/sh
# A Python with vLLM 0.26.0 "installed" that prints what real vLLM printed (a committed startup's key lines).
case "$2" in
  *importlib.metadata*) echo 0.26.0; exit 0;;
esac
printf '%s\\n' "$*" > {args}
printf '%s' "${{VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS-unset}}" > {args}.env
for a; do last=$a; done
printf '%s' "$last" > {args}.last
sleep 600 &
echo $! > {grandchild}
cat {log}
{ready}
sleep 600
"""


def _stand_in(tmp_path: Path, log: Path, ready: str) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python-with-vllm"
    python.write_text(STAND_IN.format(args=tmp_path / "args", grandchild=tmp_path / "grandchild", log=log,
                                      ready=ready))  # fmt: skip
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    for f in (python, smi):
        f.chmod(0o755)
    return python, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


SERVE_READY = "echo 'INFO 12-01 23:59:59 [api_server.py:1] Application startup complete.'"


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("entry,ready", [("llm", "echo HARNESS-VERIFY-READY"), ("serve", SERVE_READY)])
def test_a_startup_is_read_judged_saved_and_stopped(tmp_path, entry, ready):
    log, serve = _startup(tmp_path, "qwen2.5-7b-4l")
    python, env = _stand_in(tmp_path, log, ready)
    saved = tmp_path / "saved.yaml"
    result = run_harness("verify", "--entry", entry, "--python", str(python), "--timeout", "60", "--save",
                         str(saved), "--", *serve, env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "starting vLLM 0.26.0" in result.stderr and "on NVIDIA H200" in result.stderr
    assert "every judged line within 1.0%" in result.stdout
    args = (tmp_path / "args").read_text()
    if entry == "llm":
        assert '"max_num_batched_tokens": 8192' in args and "load_format='dummy'" in args
    else:
        assert "serve" in args and "--load-format dummy --skip-tokenizer-init" in args
    assert _gone(int((tmp_path / "grandchild").read_text())), "vLLM's process group outlived the verify"
    record = load_record(saved)
    assert record.figures == load_record(REAL / "qwen2.5-7b-4l.yaml").figures and record.gpu == "H200-141GB"


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("line", [
    ("vllm", "serve", "qwen2.5-7b"),
    ("vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"),
    ("python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/Qwen2.5-7B-Instruct"),
], ids=["preset", "hub-id", "api-server-path-not-here"])  # fmt: skip
def test_a_preset_starts_from_its_config_facts(tmp_path, line):
    """vLLM is started from a directory holding the preset's config facts as config.json: the preset named, the
    one published under a hub id, or the one a path not on this machine names (the OpenAI server's module form)."""
    import json

    log, _ = _startup(tmp_path, "qwen2.5-7b-4l")
    python, env = _stand_in(tmp_path, log, "echo HARNESS-VERIFY-READY")
    result = run_harness("verify", "--entry", "llm", "--python", str(python), "--timeout", "60", "--", *line,
                         "--max-model-len", "4096", env=env)  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    kwargs = json.loads((tmp_path / "args.last").read_text())  # the LLM class's keyword arguments
    assert kwargs["model"].endswith("/qwen2.5-7b") and kwargs["max_model_len"] == 4096
    assert not Path(kwargs["model"]).exists(), "the preset's directory outlived the verify"


@pytest.mark.vllm_wheel
def test_a_docker_line_starts_vllm_with_its_vllm_environment(tmp_path):
    """`docker run ... -e VLLM_X=V vllm/vllm-openai:TAG ARGS`: vLLM starts from the image's arguments, the
    container's VLLM_ variables in its environment (not as flags vLLM lacks)."""
    log, _ = _startup(tmp_path, "qwen2.5-7b-4l")
    python, env = _stand_in(tmp_path, log, SERVE_READY)
    line = ("docker", "run", "--gpus", "all", "-e", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1", "--ipc=host",
            "vllm/vllm-openai:v0.26.0", "--model", "qwen2.5-7b", "--max-model-len", "4096")  # fmt: skip
    result = run_harness("verify", "--python", str(python), "--timeout", "60", "--", *line, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    args = (tmp_path / "args").read_text()
    assert " serve " in args and "--max-model-len 4096" in args and "--env" not in args and "docker" not in args
    assert (tmp_path / "args.env").read_text() == "1"


def test_a_startup_that_fails_names_vllms_error_and_exits_1(tmp_path):
    log = tmp_path / "failed.log"
    log.write_text("(EngineCore pid=9) INFO 12-01 23:51:40 [v1/worker/gpu/model_runner.py:305] Model loading took "
                   "3.79 GiB and 2.1 seconds\n(EngineCore pid=9) ValueError: To serve at least one request with the "
                   "models's max seq len (4096), (0.06 GiB KV cache is needed, which is larger than the available KV "
                   "cache memory (0.01 GiB).\n")  # fmt: skip
    _, serve = _startup(tmp_path, "qwen2.5-7b-4l")
    python, env = _stand_in(tmp_path, log, "exit 1")
    result = run_harness("verify", "--entry", "llm", "--python", str(python), "--timeout", "60", "--", *serve,
                         env=env)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "vLLM did not start: ValueError: To serve at least one request" in result.stdout
    assert any(line.split()[:3] == ["verdict", "fails", "starts"] for line in result.stdout.splitlines())
    assert result.stdout.splitlines()[-1] == "outside 1.0%: verdict"


def test_what_cannot_start_here_is_said_plainly(tmp_path):
    log, _ = _startup(tmp_path, "qwen2.5-7b-4l")
    python, env = _stand_in(tmp_path, log, "")
    tp = run_harness("verify", "--python", str(python), "--", "vllm", "serve", "qwen2.5-7b",
                     "--tensor-parallel-size", "4", env=env)  # fmt: skip
    assert tp.returncode == 2 and "TP 4 needs 4 GPUs and this machine shows 1" in tp.stderr
    moe = run_harness("verify", "--python", str(python), "--", "vllm", "serve", "qwen3-30b-a3b",
                      "--data-parallel-size", "8", "--enable-expert-parallel", env=env)  # fmt: skip
    assert moe.returncode == 2 and "DP 8 with an MoE model" in moe.stderr and "--log FILE" in moe.stderr


# --- the launcher, with real child processes that print what vLLM prints -------------------------------------------

CHILD = """
import os, subprocess, sys, time
# a grandchild, as vLLM's engine core is one: it must not outlive the launch
open(sys.argv[1], "w").write(str(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid))
mode = sys.argv[2]
print("INFO 12-01 23:59:44 [v1/core/kv_cache_utils.py:2177] GPU KV cache size: 1,024 tokens", flush=True)
if mode == "ready":
    print("INFO 12-01 23:59:50 [entrypoints/openai/api_server.py:1] Application startup complete.", flush=True)
elif mode == "fail":
    print("ValueError: To serve at least one request with the models's max seq len (4096), 0.5 GiB KV cache is needed", flush=True)
    sys.exit(1)
time.sleep(600)
"""


def _gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("mode,status", [("ready", "ready"), ("fail", "failed"), ("hang", "timeout")])
def test_launch_is_bounded_and_leaves_no_process(tmp_path, mode, status):
    script, pid_file, log = tmp_path / "child.py", tmp_path / "grandchild.pid", tmp_path / "vllm.log"
    script.write_text(CHILD)
    started = time.monotonic()
    launched = launch([sys.executable, str(script), str(pid_file), mode], log, timeout_s=8)
    assert launched.status == status
    # Bounded: the child would sleep 600 s; the launch ends at its 8 s timeout plus the stop's grace at most.
    assert time.monotonic() - started < 60
    assert launched.returncode == (1 if mode == "fail" else -signal.SIGTERM)  # stopped by SIGTERM, not killed
    assert "GPU KV cache size: 1,024 tokens" in launched.log
    assert _gone(int(pid_file.read_text())), "the grandchild outlived the launch"
    if mode == "fail":
        assert parse_log(launched.log).error is None  # the figures were printed: ready as far as the KV cache goes
        assert "ValueError: To serve at least one request" in launched.log


@pytest.mark.gpu
def test_a_real_vllm_startup_beside_the_plan(tmp_path):
    """Real vLLM, where it is importable here, on a 2-layer Llama-shaped config: the figures come back as a record."""
    pytest.importorskip("vllm")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: no GPU to start vLLM on")
    import json

    record = load_record(REAL / "llama-8b-4l-eager.yaml")
    config = tmp_path / "llama-2l"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({**record.config, "num_hidden_layers": 2}))
    saved = tmp_path / "startup.yaml"
    result = run_harness("verify", "--entry", "llm", "--timeout", "600", "--python", sys.executable, "--save",
                         str(saved), "--", "vllm", "serve", str(config), "--max-model-len", "4096",
                         "--max-num-batched-tokens", "8192", "--max-num-seqs", "256", "--enforce-eager",
                         timeout_s=700)  # fmt: skip
    assert result.returncode in (0, 1), result.stdout + result.stderr
    got = load_record(saved)
    assert got.status == "ready" and got.figures.kv_cache_tokens and got.figures.model_loading_gib
    assert "KV tokens" in result.stdout


def test_a_config_only_directory_is_said_in_the_record_and_planned_so(tmp_path):
    """A startup from a directory without safetensors says so in its record's source, and the record's plan then
    builds what vLLM builds from such a directory (GPTQ's linears unquantized: harness.sizing.release_defaults)."""
    import dataclasses
    import json

    from harness.verify.cli import _config_only
    from harness.verify.planning import CONFIG_ONLY, record_facts

    bare, full = tmp_path / "bare", tmp_path / "full"
    for directory in (bare, full):
        directory.mkdir()
        (directory / "config.json").write_text("{}")
    (full / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert _config_only(["vllm", "serve", str(bare), "--max-model-len", "4096"]) == f"; {CONFIG_ONLY}"
    assert _config_only(["vllm", "serve", str(full)]) == ""
    assert _config_only(["vllm", "serve", "qwen3-8b"]) == ""  # a preset: the published checkpoint
    record = load_record(Path(__file__).parent / "data" / "real_startups" / "llama-8b-4l-gptq.yaml")
    assert record_facts(record).checkpoint_tensors is False
    assert json.loads(json.dumps(record.config))["quantization_config"]["quant_method"] == "gptq"
    elsewhere = record.model_copy(update={"source": "harness verify (llm entry)"})
    assert record_facts(elsewhere).checkpoint_tensors is None
    assert dataclasses.replace(record_facts(elsewhere), checkpoint_tensors=False) == record_facts(record)
