"""`harness vllm diff BASE HEAD` on real releases, on two source trees, and on bad input.

The trees are copies of the cached 0.30.0 wheel's files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.sizing.vllm_diff import VllmDiff, markdown
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.sources import default_cache_dir

PR_CASE = "DeepSeek-V3 DP32 DeepEP LL (the case of vLLM PR 55579)"
CUTLASS = "CutlassBatchedExpertsFp8"
CUTLASS_FILE = "vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py"
GIB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def each_sweep_once():
    """A tree's sweep with the same arguments runs once in this module: the diffs compare the same two releases both
    ways, and one pair of trees at two thresholds. A tree is the parsed object evaluate.source_tree gives (the same
    for a release, and for a source tree while its files hold the same bytes), so a planted tree is swept anew."""
    from harness.sizing.vllm_source import sweep as sweep_module

    real = sweep_module.sweep
    done: dict[tuple[int, str], tuple[object, object]] = {}  # the tree is kept with its result: its id stays its own

    def once(tree, **kwargs):
        key = (id(tree), repr(sorted(kwargs.items())))
        if key not in done:
            done[key] = (tree, real(tree, **kwargs))
        return done[key][1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep_module, "sweep", once)
        yield


def diff_json(*args: str) -> tuple[int, dict]:
    # both sides are trusted trees: each sweep gets room for a loaded machine (the default is a hostile tree's bound)
    completed = run_cli_inproc("vllm", "diff", *args, "--json", "--budget-s", "120")
    assert completed.returncode in (0, 1), completed.stderr
    return completed.returncode, json.loads(completed.stdout)


@pytest.mark.vllm_wheel
def test_0_30_0_to_0_29_0_fails_on_the_pr_case_with_the_kv_tokens_it_costs(tmp_path):
    # One diff writes all three: the JSON on stdout, the pull-request comment and the JUnit XML to files.
    junit, comment = tmp_path / "diff.xml", tmp_path / "comment.md"
    code, data = diff_json("0.30.0", "0.29.0", "--junit", str(junit), "--markdown", str(comment))
    text = comment.read_text()
    assert "**FAILED**" in text
    pr_line = next(line for line in text.splitlines() if line.startswith(f"- :x: {PR_CASE}"))
    # The PR case: 3.5 GiB -> 112 GiB of workspace per GPU, the deployment no longer starts, and every KV token of
    # 0.30.0's plan is lost.
    assert "starts -> oom" in pr_line and "3.50 -> 112.00 GiB" in pr_line
    assert "model_executor/layers/fused_moe/experts/cutlass_moe.py:" in pr_line
    assert code == 1 and data["schema_version"] == 1 and data["kind"] == "vllm-diff"
    pr = next(d for d in data["deployments"] if d["name"] == PR_CASE)
    assert pr["base"]["moe_workspace_bytes"] == int(3.5 * GIB) and pr["head"]["moe_workspace_bytes"] == 112 * GIB
    assert pr["kv_tokens_delta"] == -pr["base"]["kv_tokens"] < -500_000
    assert f"KV cache {pr['base']['kv_tokens']:,} -> 0 tokens ({pr['kv_tokens_delta']:+,})" in pr_line
    assert pr["verdict_flip"] == "starts -> oom" and pr["regression"]
    cutlass = next(c for c in data["classes"] if c["name"] == CUTLASS)
    assert cutlass["change"] == "grew" and cutlass["max_growth"] == 256 and cutlass["regression"]
    assert cutlass["file"] == "model_executor/layers/fused_moe/experts/cutlass_moe.py" and cutlass["line"] > 0
    # A deployment whose experts class neither release changed plans the same on both (gpt-oss: MXFP4 experts).
    gpt_oss = next(d for d in data["deployments"] if d["name"] == "gpt-oss-120b DP8")
    assert gpt_oss["skipped"] is None and not gpt_oss["regression"] and gpt_oss["verdict_flip"] is None
    assert gpt_oss["base"]["kv_tokens"] == gpt_oss["head"]["kv_tokens"] > 0
    suite = ET.parse(junit).getroot()
    failures = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert PR_CASE in failures and int(suite.get("failures")) == len(data["regressions"])


@pytest.mark.vllm_wheel
def test_0_29_0_to_0_30_0_passes_and_says_what_it_bought(tmp_path):
    comment = tmp_path / "comment.md"
    code, data = diff_json("0.29.0", "0.30.0", "--markdown", str(comment))
    assert code == 0 and data["regressions"] == []
    text = comment.read_text()
    # The comment is the JSON result rendered: the two outputs of one diff agree.
    assert text.rstrip("\n") == markdown(VllmDiff.model_validate(data)).rstrip("\n")
    assert "**OK**: no regression past the 1% threshold" in text
    assert ":x:" not in text  # no regression line
    bought = next(line for line in text.splitlines() if line.startswith(f"- :white_check_mark: {PR_CASE}"))
    assert "oom -> starts" in bought and "112.00 -> 3.50 GiB" in bought and "KV cache 0 -> " in bought
    pr = next(d for d in data["deployments"] if d["name"] == PR_CASE)
    assert pr["kv_tokens_delta"] == pr["head"]["kv_tokens"] > 500_000 and pr["improvement"]
    # Unchanged deployments stay unchanged: Qwen3-235B runs Triton experts, which the fix did not touch.
    qwen = next(d for d in data["deployments"] if d["name"].startswith("Qwen3-235B"))
    assert qwen["kv_tokens_delta"] == 0 and qwen["workspace_ratio"] == 1 and qwen["regression"] is None


def source_copy(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(locate(version="0.30.0", cache_dir=default_cache_dir()).root / "vllm", root / "vllm")
    return root


@pytest.mark.vllm_wheel
def test_two_source_trees_and_a_threshold(tmp_path):
    base = source_copy(tmp_path, "base")
    head = source_copy(tmp_path, "head")
    path = head / CUTLASS_FILE
    old = "workspace1 = (experts_per_worker, M, max(N, K))"
    text = path.read_text()
    assert text.count(old) == 1
    # A 3% larger workspace13 (one row in 32 more): a regression past 1%, not past 5%.
    path.write_text(text.replace(old, "workspace1 = (experts_per_worker, M + M // 32, max(N, K))"))
    references = tmp_path / "refs.yaml"
    references.write_text(
        "schema_version: 1\ndeployments:\n"
        "  - name: pr\n    serve: vllm serve deepseek-v3 -dp 32 -ep --all2all-backend deepep_low_latency "
        "--moe-backend cutlass --enable-eplb --num-redundant-experts 256 --max-num-batched-tokens 256 "
        "--max-model-len 32768\n    gpu: H200-141GB\n")  # fmt: skip
    code, data = diff_json(str(base), str(head), "--references", str(references))
    assert code == 1 and [d["name"] for d in data["deployments"]] == ["pr"]
    cutlass = next(c for c in data["classes"] if c["name"] == CUTLASS)
    assert cutlass["change"] == "grew" and 1.01 < cutlass["max_growth"] < 1.05
    changed = [c["name"] for c in data["classes"] if c["change"] not in ("same", "not comparable")]
    assert changed == [CUTLASS]
    pr = data["deployments"][0]
    assert pr["head"]["moe_workspace_bytes"] > pr["base"]["moe_workspace_bytes"]
    assert pr["kv_tokens_delta"] < 0 and pr["base"]["verdict"] == pr["head"]["verdict"] == "starts"
    # Past 5% only: the same growth is reported and is not a regression.
    code, data = diff_json(str(base), str(head), "--references", str(references), "--threshold", "5")
    assert code == 0 and data["regressions"] == []
    assert next(c for c in data["classes"] if c["name"] == CUTLASS)["change"] == "grew"


@pytest.mark.parametrize(("args", "says"), [
    (("0.30.0", "/no/such/dir"), "HEAD /no/such/dir: no such file or directory, and not a release number X.Y.Z"),
    (("0.30.0", "0.29.0", "--threshold", "-1"), "--threshold -1.0: a percentage from 0 to 1000 is allowed"),
    (("0.30.0", "0.29.0", "--references", "/no/refs.yaml"), "--references /no/refs.yaml: cannot be read"),
    (("0.30.0", "0.29.0", "--budget-s", "0"), "--budget-s 0.0: a number of CPU seconds in (0, 86400] is allowed"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, says):
    completed = run_cli_inproc("vllm", "diff", *args)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert says in completed.stderr and completed.stderr.strip().count("\n") == 0
    assert "Traceback" not in completed.stderr


def test_bad_references_file_names_the_field(tmp_path):
    bad = tmp_path / "refs.yaml"
    bad.write_text("schema_version: 1\ndeployments:\n  - name: x\n    serve: vllm serve deepseek-v3\n")
    completed = run_cli_inproc("vllm", "diff", "0.30.0", "0.29.0", "--references", str(bad))
    assert completed.returncode == 2
    assert "deployments.0.gpu: Field required" in completed.stderr and completed.stderr.count("\n") == 1
    wheel = tmp_path / "x.txt"
    wheel.write_text("x")
    completed = run_cli_inproc("vllm", "diff", str(wheel), "0.29.0")
    assert completed.returncode == 2 and "a file that is not a wheel (*.whl)" in completed.stderr
