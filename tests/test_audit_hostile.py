"""`harness vllm audit` of a hostile vLLM source tree: it runs none of the tree's code and writes nothing.

Every batched-experts class of the tree below tries one escape from the interpreter (walking
`object.__subclasses__()`, reaching `os` through a module's globals or `__builtins__`, an endless loop, a huge
allocation, deep recursion, an import, a file write). Each would leave its own canary file if any of its code ran.
The audit runs as the real CLI in a subprocess and ends within AUDIT_BOUND_S.

The second half checks the interpreter's budget edges one by one: the last value inside each limit is evaluated,
the first one past it is refused with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cli_utils import REPO_DIR, harness_env
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.cache import PINNED_WHEELS
from harness.sizing.vllm_source.evaluate import SourceTree
from harness.sizing.vllm_source.interpreter import StandIn, Unevaluable
from vllm_cache_utils import forge_entry

FUSED_MOE = "vllm/model_executor/layers/fused_moe"
AUDIT_BOUND_S = 10.0  # the audit of a hostile source tree ends within 10 s, whatever the tree tries
# The sweep (`--sweep`) ends within twice that: a method that runs out of its budget once is not evaluated again.

MODULAR_KERNEL = """
    class FusedMoEActivationFormat:
        Standard = "standard"
        BatchedExperts = "batched"

    class BatchedBase:
        @staticmethod
        def activation_format():
            return FusedMoEActivationFormat.BatchedExperts
"""

# {canary} is the directory each escape would write into; SIGNATURE is the workspace_shapes parameter list.
HOSTILE_EXPERTS = """
    import os
    import subprocess
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    os.system("touch {canary}/module-level")  # would run if the module were imported or executed


    def _shell(command):
        return os.system(command)


    def _forever(depth):
        return _forever(depth + 1)


    class WalksSubclasses(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            for cls in ().__class__.__bases__[0].__subclasses__():
                if cls.__name__ == "Popen":
                    cls(["touch", "{canary}/subclasses"])
            return ((M,), (M,), (M,))


    class ReachesModuleGlobals(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            _shell.__globals__["os"].system("touch {canary}/globals")
            return ((M,), (M,), (M,))


    class ReachesBuiltins(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            __builtins__["__import__"]("os").system("touch {canary}/builtins")
            return ((M,), (M,), (M,))


    class UsesImportedModule(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            subprocess.run(["touch", "{canary}/subprocess"])
            return ((M,), (M,), (M,))


    class CallsShellHelper(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            _shell("touch {canary}/helper")
            return ((M,), (M,), (M,))


    class LoopsForever(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            while True:
                pass


    class AllocatesHugeList(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            rows = [1] * 10**9
            return ((M,), (M,), (M,))


    class ComputesHugePower(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            return ((10**10**10,), (M,), (M,))


    class RecursesForever(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            return _forever(0)


    class ImportsAtCallTime(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            import shutil
            shutil.rmtree("{canary}")
            return ((M,), (M,), (M,))


    class WritesAFile(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            open("{canary}/written", "w").write("x")
            return ((M,), (M,), (M,))


    class HookInDefault(mk.BatchedBase):
        def workspace_shapes(SIGNATURE, hook=os.system("touch {canary}/default")):
            return ((M * hook,), (M,), (M,))


    class HookInProperty(mk.BatchedBase):
        @property
        def num_dispatchers(self):
            return os.system("touch {canary}/property")

        def workspace_shapes(SIGNATURE):
            return ((M * self.num_dispatchers,), (M,), (M,))
"""
SIGNATURE = "self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta"

# What each class's reason must say: the construct or limit that stopped it.
EXPECTED_REASONS = {
    "WalksSubclasses": "reads the attribute __class__, and dunder attributes are outside the subset",
    "ReachesModuleGlobals": "reads the attribute __globals__, and dunder attributes are outside the subset",
    "ReachesBuiltins": "uses the name '__builtins__', which is only defined when vLLM is imported",
    "UsesImportedModule": "uses the name 'subprocess', which is only defined when vLLM is imported",
    "CallsShellHelper": "uses the name 'os', which is only defined when vLLM is imported",
    "LoopsForever": "exceeded the step budget of 100000 evaluated AST nodes",
    "AllocatesHugeList": "repeats a list of 1 items 1000000000 times, over the size budget of 64",
    "ComputesHugePower": "computes 10 ** 10000000000, over the size budget of 2^64",
    "RecursesForever": "calls nested deeper than 32",
    "ImportsAtCallTime": "imports shutil at call time, which needs vLLM itself",
    "WritesAFile": "uses the name 'open', which is only defined when vLLM is imported",
    "HookInDefault": "uses the name 'os', which is only defined when vLLM is imported",
    "HookInProperty": "uses the name 'os', which is only defined when vLLM is imported",
}


def fused_moe_package(root: Path, canary: Path, experts: str, file: str) -> Path:
    """root/vllm/.../fused_moe holding the modular kernel's stand-in and `experts` (SIGNATURE, {canary} filled)."""
    package = root / FUSED_MOE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "modular_kernel.py").write_text(textwrap.dedent(MODULAR_KERNEL))
    text = textwrap.dedent(experts).replace("SIGNATURE", SIGNATURE).replace("{canary}", str(canary))
    (package / file).write_text(text)
    return package


def hostile_tree(root: Path, canary: Path) -> Path:
    """A vLLM source tree of hostile classes, plus files that hang or blow up whoever reads them."""
    package = fused_moe_package(root, canary, HOSTILE_EXPERTS, "hostile_moe.py")
    # Files no reader may open blindly: a FIFO (a read blocks forever) and a link to /dev/zero (never ends).
    os.mkfifo(package / "fifo_moe.py")
    (package / "zero_moe.py").symlink_to("/dev/zero")
    # Too large to read, and too deep to parse; both name the batched format, so the audit lists them.
    (package / "huge_moe.py").write_text("# BatchedExperts\n" + "x = 1\n" * 200_000)
    (package / "deep_moe.py").write_text("# BatchedExperts\nx = " + "(" * 5000 + ")" * 5000 + "\n")
    (root / "vllm" / "_version.py").write_text("__version__ = '6.6.6'\n")
    return root


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under directory (links not followed): type, size, mtime and, for regular files, content hash."""
    entries: dict[str, tuple] = {}
    for current, dirs, files in os.walk(directory, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(current) / name
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
            entries[path.relative_to(directory).as_posix()] = (stat.S_IFMT(info.st_mode), info.st_size,
                                                               info.st_mtime_ns, digest)  # fmt: skip
    return entries


def test_hostile_tree_audit_runs_nothing_and_writes_nothing(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    tree = hostile_tree(tmp_path / "vllm-src", canary)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = harness_env() | {"HARNESS_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
    before = snapshot(tmp_path)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "harness", "vllm", "audit", "--vllm-src", str(tree), "--json"],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=AUDIT_BOUND_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the audit of a hostile tree ran past its bound of {AUDIT_BOUND_S} s")
    assert snapshot(tmp_path) == before, "the audit wrote, changed or removed something"
    assert list(canary.iterdir()) == [], "code of the hostile tree ran"
    assert completed.returncode == 0, completed.stderr  # nothing double-counts: every class is unevaluated
    assert "Traceback" not in completed.stderr

    report = json.loads(completed.stdout)
    classes = {c["name"]: c for c in report["classes"] if c["name"] != "(unparsed file)"}
    assert set(classes) == set(EXPECTED_REASONS)
    for name, says in EXPECTED_REASONS.items():
        entry = classes[name]
        assert entry["verdict"] == "unevaluated" and entry["total_bytes"] is None, (name, entry)
        assert says in entry["reason"] and "(hostile_moe.py line " in entry["reason"], (name, entry["reason"])
    unparsed = {Path(c["file"]).name: c["reason"] for c in report["classes"] if c["name"] == "(unparsed file)"}
    assert set(unparsed) == {"fifo_moe.py", "zero_moe.py", "huge_moe.py", "deep_moe.py"}
    assert "not a regular file" in unparsed["fifo_moe.py"] and "not a regular file" in unparsed["zero_moe.py"]
    assert "over the 1048576 bytes read of one file" in unparsed["huge_moe.py"]
    assert "SyntaxError: too many nested parentheses" in unparsed["deep_moe.py"]


# --- a hostile tree planted in the cache, reached by a plain `harness plan` ---------------------------------------


def plan_scenario(path: Path, version: str) -> Path:
    """The PR case with a vllm==version policy, which `harness plan` sizes from that release's cached source."""
    scenario = yaml.safe_load((REPO_DIR / "scenarios" / "deepseek-v3-dp32-pr55579.yaml").read_text())
    scenario["policies"] = ["fixed", f"vllm=={version}"]
    scenario["expect"]["outcomes"] = {"fixed": "fit", f"vllm=={version}": "fit"}
    path.write_text(yaml.safe_dump(scenario))
    return path


def plant(cache: Path, version: str, canary: Path, *, wheel_sha256: str) -> Path:
    """The hostile tree as the cache entry of release `version`, with a manifest and RECORD that agree with it."""
    planted = hostile_tree(cache.parent / f"planted-{version}", canary)
    package = planted / FUSED_MOE
    for name in ("fifo_moe.py", "zero_moe.py", "huge_moe.py", "deep_moe.py"):
        (package / name).unlink()
    # The class `vllm==X` sizes with, hostile as the others.
    cutlass = HOSTILE_EXPERTS.split("class WalksSubclasses")[1].split("class ReachesModuleGlobals")[0]
    (package / "hostile_moe.py").write_text(
        (package / "hostile_moe.py").read_text()
        + "\n\nclass CutlassBatchedExpertsFp8"
        + cutlass.replace("SIGNATURE", SIGNATURE).replace("{canary}", str(canary))
    )
    files = {p.relative_to(planted).as_posix(): p.read_bytes() for p in planted.rglob("*") if p.is_file()}
    entry = cache / "vllm" / version / "release"
    forge_entry(entry, files, kind="release", version=version, wheel_sha256=wheel_sha256)
    return entry


def run_plan(scenario: Path, cache: Path, workdir: Path) -> subprocess.CompletedProcess:
    env = harness_env() | {"HARNESS_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "harness", "plan", str(scenario)], cwd=workdir, env=env, capture_output=True,
        text=True, timeout=AUDIT_BOUND_S, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("claims", ["the pinned wheel", "another wheel"])
def test_planted_entry_of_a_pinned_release_is_refused(tmp_path, claims):
    """A self-consistent forgery of vllm 0.30.0's entry: its RECORD (or its wheel hash) is not the pinned one."""
    canary = tmp_path / "canary"
    canary.mkdir()
    pinned = PINNED_WHEELS["0.30.0"].wheel_sha256
    entry = plant(
        tmp_path / "cache", "0.30.0", canary, wheel_sha256=pinned if claims == "the pinned wheel" else "e" * 64
    )
    scenario = plan_scenario(tmp_path / "scenario.yaml", "0.30.0")
    before = snapshot(tmp_path)
    completed = run_plan(scenario, tmp_path / "cache", tmp_path)
    assert snapshot(tmp_path) == before and list(canary.iterdir()) == []
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert f"cache entry {entry} " in lines[0] and f"delete {entry} (rm -r)" in lines[0]
    why = (
        "holds a RECORD that is not vllm 0.30.0's"
        if claims == "the pinned wheel"
        else f"claims wheel sha256 {'e' * 64}"
    )
    assert why in lines[0]


def test_planted_entry_outside_the_pins_runs_nothing(tmp_path):
    """A release the harness has no pin for is trusted through the cache's ownership and permissions; what such an
    entry holds is still only read, never run."""
    canary = tmp_path / "canary"
    canary.mkdir()
    entry = plant(tmp_path / "cache", "9.9.9", canary, wheel_sha256="e" * 64)
    scenario = plan_scenario(tmp_path / "scenario.yaml", "9.9.9")
    before = snapshot(tmp_path)
    completed = run_plan(scenario, tmp_path / "cache", tmp_path)
    assert snapshot(tmp_path) == before and list(canary.iterdir()) == []
    assert completed.returncode == 2 and len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert (
        "vllm 9.9.9: CutlassBatchedExpertsFp8 in model_executor/layers/fused_moe/hostile_moe.py was not evaluated"
        in (completed.stderr)
    )
    assert "dunder attributes are outside the subset" in completed.stderr
    # Writable by anyone: refused before anything is read.
    (entry / "manifest.json").chmod(0o666)
    completed = run_plan(scenario, tmp_path / "cache", tmp_path)
    assert completed.returncode == 2 and "manifest.json, which anyone may write" in completed.stderr


# --- the budget's edges, one limit at a time --------------------------------------------------------------------

EDGES = """
    def power(exponent):
        return 2 ** exponent

    def shift(bits):
        return 1 << bits

    def repeat(count):
        return [0] * count

    def concat(count):
        return "a" * (count - 1) + "b"

    def nest(depth):
        value = 0
        for _ in range(depth):
            value = (value,)
        return value

    def wide(extra):
        row = (0,) * 15
        return (row,) * 63 + ((0,) * extra,)  # 1 + 63 * 16 + 1 + extra nodes

    def spin(count):
        total = 0
        for i in range(count):
            total += 1
        return total

    def recurse(depth):
        return 0 if depth == 0 else 1 + recurse(depth - 1)

    def compare_wide(extra):
        a = wide(extra)
        b = wide(extra)
        equal = 0
        for _ in range(10**6):
            equal += a == b
        return equal

    def rounds(digits):
        return round(12345, digits)

    def dunder(value):
        return value.__class__

    def lambda_():
        return (lambda: 0)()

    def try_():
        try:
            return 1
        except Exception:
            return 2

    def mutate():
        rows = [1, 2]
        rows[0] = 3
        return rows

    def unknown_iterable(value):
        return [x for x in value]

    def deletes(a, b):
        del a, b
        return 1

    def reads_deleted(a):
        del a
        return a

    def deletes_item(rows):
        del rows[0]
        return rows
"""


@pytest.fixture(scope="module")
def edges(tmp_path_factory) -> tuple[SourceTree, str]:
    root = tmp_path_factory.mktemp("edges")
    (root / FUSED_MOE).mkdir(parents=True)
    (root / FUSED_MOE / "edges.py").write_text(textwrap.dedent(EDGES))
    return SourceTree(locate(src=root)), f"{FUSED_MOE}/edges.py"


@pytest.mark.parametrize(
    ("function", "inside", "past", "says"),
    [
        ("power", 63, 64, "computes 2 ** 64, over the size budget of 2^64"),
        ("shift", 63, 64, "integer of 65 bits, over the size budget of 64 bits"),
        ("repeat", 64, 65, "repeats a list of 1 items 65 times, over the size budget of 64"),
        ("concat", 4096, 4097, "concatenates strs to 4097 items, over the size budget of 4096"),
        ("nest", 8, 9, "nests containers 9 deep, over the size budget of 8"),
        ("wide", 14, 15, "builds a value of 1025 nodes, over the size budget of 1024"),
        ("recurse", 31, 32, "calls nested deeper than 32"),
        ("rounds", -400, -401, "round() to -401 digits; at most 400 either way"),  # 10**(10**18) inside Python
    ],
)
def test_budget_edges(edges, function, inside, past, says):
    tree, file = edges
    assert tree.call_function(file, function, arguments={_parameter(function): inside}) is not None
    with pytest.raises(Unevaluable) as raised:
        tree.call_function(file, function, arguments={_parameter(function): past})
    assert says in str(raised.value)


def _parameter(function: str) -> str:
    return {"power": "exponent", "shift": "bits", "repeat": "count", "concat": "count", "nest": "depth",
            "wide": "extra", "recurse": "depth", "rounds": "digits"}[function]  # fmt: skip


def test_step_budget_bounds_loops_and_comparisons(edges):
    tree, file = edges
    assert tree.call_function(file, "spin", arguments={"count": 1000}) == 1000
    with pytest.raises(Unevaluable, match=r"exceeded the step budget of 100000 evaluated AST nodes \(edges.py line"):
        tree.call_function(file, "spin", arguments={"count": 10**18})
    # Comparing two 1024-node values walks them: the walk is charged, so a loop of them stops at the budget.
    with pytest.raises(Unevaluable, match=r"exceeded the step budget"):
        tree.call_function(file, "compare_wide", arguments={"extra": 14})


@pytest.mark.parametrize(
    ("function", "arguments", "says"),
    [
        ("dunder", {"value": 1}, "reads the attribute __class__, and dunder attributes are outside the subset"),
        ("lambda_", {}, "uses Lambda, which is outside the evaluated subset (edges.py line"),
        ("try_", {}, "uses Try, which is outside the evaluated subset (edges.py line"),
        ("mutate", {}, "assigns an item of a container"),
        ("unknown_iterable", {"value": StandIn("config")}, "iterates over <stand-in config>"),
        # `del name` unbinds a local name, as in Python; a deleted name read again, or a deleted item, is refused.
        ("reads_deleted", {"a": 1}, "reads the local name 'a' before it is assigned"),
        ("deletes_item", {"rows": [1, 2]}, "deletes rows[0]; only local names are deleted in the subset"),
    ],
)
def test_outside_the_subset(edges, function, arguments, says):
    tree, file = edges
    with pytest.raises(Unevaluable) as raised:
        tree.call_function(file, function, arguments=arguments)
    assert says in str(raised.value)


def test_del_of_local_names_is_evaluated(edges):
    tree, file = edges
    assert tree.call_function(file, "deletes", arguments={"a": 1, "b": (2, 3)}) == 1


HOSTILE_APPLY = """
    import os
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk


    def _resize_cache(x, v):
        return x


    class EscapesInApply(mk.BatchedBase):
        def workspace_shapes(SIGNATURE):
            return ((local_num_experts, M, max(N, K)), (local_num_experts, M, N), (local_num_experts, M, K))

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            os.system("touch {canary}/apply")
            hidden_states.__class__.__bases__[0].__subclasses__()
            (lambda: open("{canary}/lambda", "w"))()
            view = _resize_cache(workspace13, (hidden_states.size(0) * hidden_states.size(1), w1.size(1)))
            while True:
                view = _resize_cache(workspace2, (1,))
"""


def test_hostile_apply_is_traced_without_running_anything(tmp_path):
    # The sweep's tracer is tolerant of what it cannot follow: it turns it into opaque values, and never runs it.
    canary = tmp_path / "canary"
    canary.mkdir()
    root = tmp_path / "vllm-src"
    fused_moe_package(root, canary, HOSTILE_APPLY, "hostile_apply_moe.py")
    before = snapshot(tmp_path)
    completed = subprocess.run(
        [sys.executable, "-m", "harness", "vllm", "audit", "--sweep", "--vllm-src", str(root), "--json"],
        cwd=tmp_path, env=harness_env(), capture_output=True, text=True, timeout=2 * AUDIT_BOUND_S, check=False,
    )  # fmt: skip
    assert snapshot(tmp_path) == before and list(canary.iterdir()) == []
    assert completed.returncode == 0, completed.stderr
    (cls,) = json.loads(completed.stdout)["classes"]
    # Nothing of what apply() uses is derived: no point passes (not derived), none fails.
    assert cls["name"] == "EscapesInApply" and cls["verdict"] == "not derived"
    # The endless loop ran out of the step budget on the first trace; the live set says so.
    assert cls["live_set"].startswith("not derived: apply could not be traced: exceeded the step budget")


def test_hostile_tree_sweep_runs_nothing_and_writes_nothing(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    tree = hostile_tree(tmp_path / "vllm-src", canary)
    env = harness_env() | {"HARNESS_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}
    before = snapshot(tmp_path)
    completed = subprocess.run(
        [sys.executable, "-m", "harness", "vllm", "audit", "--sweep", "--vllm-src", str(tree), "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=2 * AUDIT_BOUND_S, check=False,
    )  # fmt: skip
    assert snapshot(tmp_path) == before and list(canary.iterdir()) == []
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert {c["name"] for c in report["classes"]} == set(EXPECTED_REASONS)
    assert all(c["verdict"] == "unevaluated" for c in report["classes"])
    assert set(report["unparsed"]) >= {f"{FUSED_MOE}/fifo_moe.py", f"{FUSED_MOE}/huge_moe.py"}


# --- bounded in total: the whole audit and sweep, not only each evaluation ----------------------------------------

# A class whose workspace_shapes runs just under the step budget: each point costs a full budget, never an error.
NEAR_BUDGET_CLASS = """

class NearBudget{index}(mk.BatchedBase):
    def workspace_shapes(SIGNATURE):
        total = 0
        for step in range(11000):
            total = total + 1
        return ((local_num_experts, M, K), (local_num_experts, M, K), (local_num_experts, M, K))
"""


def near_budget_tree(root: Path, canary: Path, classes: int) -> Path:
    body = "import vllm.model_executor.layers.fused_moe.modular_kernel as mk\n" + "".join(
        NEAR_BUDGET_CLASS.format(index=i) for i in range(classes)
    )
    fused_moe_package(root, canary, body, "slow_moe.py")
    return root


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=harness_env(), capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip


def test_near_budget_class_is_evaluated_not_refused(tmp_path):
    # The class itself is within the per-evaluation budget: what bounds a tree of them is the whole-sweep budget.
    tree = SourceTree(locate(src=near_budget_tree(tmp_path / "src", tmp_path, 1)))
    (cls,) = tree.batched_classes()
    from harness.core.contract import SizingArgs

    args = SizingArgs(max_tokens_per_rank=4, num_dispatchers=2, num_local_experts=1, num_global_experts=2,
                      hidden_size=8, intermediate_size=8, top_k=1)  # fmt: skip
    assert tree.evaluate(cls, args).ws13 == (1, 8, 8)


@pytest.fixture(scope="module")
def near_budget_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tree of 30 near-budget classes and its `--sweep --json --budget-s 2`, run once for the two tests that read
    it: (the directory it ran in, the tree under it; the command's outcome)."""
    work = tmp_path_factory.mktemp("near-budget")
    tree = near_budget_tree(work / "src", work, 30)
    return work, run_cli("vllm", "audit", "--sweep", "--vllm-src", str(tree), "--json", "--budget-s", "2", cwd=work)


def test_hostile_sweep_ends_within_its_budget_with_a_clear_line(near_budget_sweep):
    work, completed = near_budget_sweep
    tree = work / "src"
    assert completed.returncode == 1, completed.stderr  # not a pass: the tree was not swept whole
    report = json.loads(completed.stdout)
    (limit,) = report["limits"]
    assert limit.startswith("the sweep's time budget of 2 s of CPU ran out (--budget-s raises it for a tree you "
                            "trust); points not evaluated in ")  # fmt: skip
    assert len(report["classes"]) == 30
    cut = [c for c in report["classes"] if any(g["status"] == "unevaluated" and "time budget of 2 s" in g["detail"]
                                              for g in c["groups"])]  # fmt: skip
    assert len(cut) >= 25  # the first few classes took the budget; the rest carry the reason
    table = run_cli("vllm", "audit", "--sweep", "--vllm-src", str(tree), "--budget-s", "2", cwd=work)
    assert table.returncode == 1
    assert "LIMIT: the sweep's time budget of 2 s of CPU ran out" in table.stdout
    assert "INCOMPLETE: the sweep stopped at a limit" in table.stdout


def test_hostile_audit_ends_within_its_budget(tmp_path):
    tree = near_budget_tree(tmp_path / "src", tmp_path, 400)
    completed = run_cli("vllm", "audit", "--vllm-src", str(tree), "--json", "--budget-s", "1", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    classes = json.loads(completed.stdout)["classes"]
    assert len(classes) == 256  # the cap on classes per audit
    out_of_time = [c for c in classes if "the audit's time budget of 1 s of CPU ran out" in c["reason"]]
    assert len(out_of_time) > 200 and all(c["verdict"] == "unevaluated" for c in out_of_time)


def test_huge_activation_enum_and_looping_supports_are_capped(tmp_path):
    root = tmp_path / "src"
    package = fused_moe_package(
        root,
        tmp_path,
        """
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk

        class LoopingSupport(mk.BatchedBase):
            @staticmethod
            def _supports_activation(activation):
                while True:
                    pass

            def workspace_shapes(SIGNATURE):
                return ((local_num_experts, M, K), (0,), (local_num_experts, M, K))
    """,
        "looping_moe.py",
    )
    members = "\n".join(f'    A{i} = "a{i}"' for i in range(10_000))
    (package / "activation.py").write_text(f"class MoEActivation:\n{members}\n")
    completed = run_cli("vllm", "audit", "--sweep", "--vllm-src", str(root), "--json", cwd=tmp_path)
    report = json.loads(completed.stdout)
    assert report["activations"] == [f"a{i}" for i in range(32)]
    assert report["limits"][0] == ("MoEActivation has 10000 members: the first 32 are swept (the cap on "
                                   "activations)")  # fmt: skip
    (cls,) = report["classes"]
    # The looping _supports_activation ran out of its step budget once, and was not called again.
    assert cls["name"] == "LoopingSupport" and cls["verdict"] in ("not derived", "consistent")


def test_ast_dense_files_are_capped(tmp_path):
    root = tmp_path / "src"
    package = fused_moe_package(root, tmp_path, "x = 1\n", "plain_moe.py")
    dense = "# BatchedExperts\nx = (" + "1," * 450_000 + ")\n"  # about 900 kB, 450,000 AST nodes each
    for i in range(4):
        (package / f"dense{i}_moe.py").write_text(dense)
    tree = SourceTree(locate(src=root))
    capped = {Path(f).name: why for f, why in tree.unparsed.items() if "AST nodes" in why}
    assert len(capped) == 1 and "over the 1500000 nodes kept of a tree" in next(iter(capped.values()))
    assert tree.ast_nodes <= 1_500_000


def test_hostile_sweep_ends_at_its_budget(near_budget_sweep):
    # A hostile tree's sweep stops at its CPU budget with the line; the default budget, which holds such a sweep to
    # about a minute, is 60 s (the same Deadline, with --budget-s 2 here so that the test does not spend 60 s).
    from harness.sizing.vllm_source.sweep import SweepBudget

    assert SweepBudget().cpu_s == 60.0
    _, completed = near_budget_sweep
    assert completed.returncode == 1, completed.stderr
    (limit,) = json.loads(completed.stdout)["limits"]
    assert limit.startswith("the sweep's time budget of 2 s of CPU ran out (--budget-s raises it for a tree you "
                            "trust)")  # fmt: skip


def test_the_cap_on_classes_is_reported(tmp_path):
    body = "import vllm.model_executor.layers.fused_moe.modular_kernel as mk\n" + "".join(
        f"\n\nclass Trivial{i}(mk.BatchedBase):\n    def workspace_shapes(SIGNATURE):\n"
        f"        return ((local_num_experts, M, K), (0,), (local_num_experts, M, K))\n"
        for i in range(300)
    )
    root = tmp_path / "src"
    fused_moe_package(root, tmp_path, body, "many_moe.py")
    completed = run_cli("vllm", "audit", "--sweep", "--vllm-src", str(root), "--json", "--budget-s", "1",
                        cwd=tmp_path)  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    report = json.loads(completed.stdout)
    assert len(report["classes"]) == 256
    assert report["limits"][0] == ("300 experts classes: the first 256 are swept (the cap on classes); not swept: "
                                   "Trivial256, Trivial257, Trivial258, Trivial259, Trivial260 ...")  # fmt: skip
    assert report["limits"][1].startswith("the sweep's time budget of 1 s of CPU ran out")
