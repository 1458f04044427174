"""`harness vllm audit --sweep`: every batched-experts class of a source, over a grid of layouts and shapes.

    grid (GRID_*): D x local experts E x T x (K, I) x activation x quantization x num_dispatchers x EPLB
        the full product of D, E, T, (K, I) at one gated and one non-gated activation; every activation of the
        release's MoEActivation (read with ast) x D x (K, I); each quantization format, num_dispatchers unset and
        an EPLB layout (E·D physical experts, one redundant per rank) x D x (K, I)
    per point: workspace_shapes (evaluate.py) -> ws13, ws2, out
        double-count    a buffer grows x D^2 from D = 1 to D (the token dim is M·D, not M = T·D)
        under-sized     a view apply() takes of a buffer (views.py) needs more than the buffer holds, or, for
                        CutlassBatchedExpertsFp8 at a gated activation, common + ws2 is below the live set the
                        harness derives for the batched CUTLASS path (harness.core.contract.live_set_bytes)
        over-allocated  common + ws2 is larger than the views need (common = max(ws13, out), which out aliases)
        consistent      none of these
        unevaluated / refused / unsupported   with the reason: the evaluation stopped; the class's apply() or
                        constructor raises or asserts at the point; the class says it does not take the
                        activation or quantization (its own _supports_* methods, where they evaluate)

The live set (apply()'s views) is traced on the sub-grid LIVE_SET_POINTS picks; elsewhere a point is judged on its
growth with D alone. Nothing of the release is imported or executed.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from harness.core.contract import SizingArgs, live_set_bytes
from harness.sizing.vllm_source.evaluate import (
    ACTIVATION_MODULE,
    ParsedClass,
    SourceTree,
    _call_arguments,
    _normalize,
    standin_attributes,
)
from harness.sizing.vllm_source.interpreter import (
    DEFAULT_BUDGET,
    DTYPES,
    Activation,
    BoundMethod,
    FakeTensor,
    Function,
    Interpreter,
    StandIn,
    Unevaluable,
)
from harness.sizing.vllm_source.views import (
    ViewTrace,
    WorkspaceTensor,
    init_parameter_default,
    trace_apply,
    trace_constructor,
)

GRID_D = (1, 2, 8, 32, 256)
GRID_E = (1, 8, 16, 64)
GRID_T = (1, 256, 8192)
# (K, I): for gated activations (N = 2I = 4096) K < N/2, K < N/2, N/2 < K < N, K > N; for non-gated ones
# (N = I = 2048) K < N/2, N/2 < K < N, K > N, K > N. Together every region for both forms.
GRID_KI = ((512, 2048), (1536, 2048), (3072, 2048), (7168, 2048))
TOP_K = 8
BASE_E, BASE_T = 16, 256  # where the activation, quantization, unset and EPLB sweeps are taken
LIVE_D = (1, 32)
FALLBACK_ACTIVATIONS = ("silu", "silu_no_mul")  # a release without MoEActivation (older ones pass strings)

# The class the harness's batched CUTLASS live set (harness.core.contract) was derived for. Up to 0.10.0 the batched
# path was CutlassExpertsFp8(use_batched_format=True), with mm2_out in workspace13 beside the output: another live
# set, judged on its own views only.
CUTLASS_BATCHED_NAMES = ("CutlassBatchedExpertsFp8",)
# Reasons of an evaluation stopped by a budget (interpreter.Budget), not by what the point asks.
BUDGET_REASONS = ("exceeded the step budget", "calls nested deeper", "nests deeper than", "nested deeper than")
QUANT_KEYS_MODULE = "vllm.model_executor.layers.quantization.utils.quant_utils"


@dataclass(frozen=True)
class QuantFormat:
    name: str
    weight_key: str | None  # QuantKey names of quant_utils, as _supports_quant_scheme compares them
    activation_key: str | None
    dtype: str | None  # quant_config.quant_dtype: "float8_e4m3fn", "nvfp4" (a string in vLLM too) or None
    per_token: bool
    block: tuple[int, int] | None

    @property
    def fp8(self) -> bool:
        return self.dtype == "float8_e4m3fn"


QUANT_FORMATS = (
    QuantFormat("fp8-per-token", "kFp8StaticChannelSym", "kFp8DynamicTokenSym", "float8_e4m3fn", True, None),
    QuantFormat("fp8-per-tensor", "kFp8StaticTensorSym", "kFp8DynamicTensorSym", "float8_e4m3fn", False, None),
    QuantFormat("fp8-block", "kFp8Static128BlockSym", "kFp8Dynamic128Sym", "float8_e4m3fn", False, (128, 128)),
    QuantFormat("nvfp4", "kNvfp4Static", "kNvfp4Dynamic", "nvfp4", False, None),
    QuantFormat("bf16", None, None, None, False, None),
)
DEFAULT_QUANT = QUANT_FORMATS[0]
QUANT_BY_NAME = {q.name: q for q in QUANT_FORMATS}

CONSISTENT, DOUBLE, UNDER, OVER = "consistent", "double-count", "under-sized", "over-allocated"
UNEVALUATED, REFUSED, UNSUPPORTED = "unevaluated", "refused", "unsupported"
FAILING = (DOUBLE, UNDER)


@dataclass(frozen=True, order=True)
class Point:
    D: int
    dispatchers: str  # "set" | "unset"
    experts: str  # "E·D" | "EPLB"
    quant: str
    activation: str
    K: int
    I: int
    E: int
    T: int

    def args(self) -> SizingArgs:
        return SizingArgs(
            max_tokens_per_rank=self.T, num_dispatchers=self.D, num_local_experts=self.E,
            num_global_experts=self.E * self.D, hidden_size=self.K, intermediate_size=self.I, top_k=TOP_K,
            activation=self.activation,
        )  # fmt: skip

    @property
    def region(self) -> str:
        """Where K falls against N (N = 2I for gated activations, I for *_no_mul)."""
        n = self.args().N
        return "K<N/2" if 2 * self.K < n else "K>N" if self.K > n else "K=N" if self.K == n else "N/2<=K<N"

    def reference(self) -> Point:
        """The same point at D = 1 with num_dispatchers set and no EPLB: what D scales from."""
        return dataclasses.replace(self, D=1, dispatchers="set", experts="E·D")


AXES = tuple(f.name for f in dataclasses.fields(Point))


@dataclass(frozen=True)
class Outcome:
    status: str
    detail: str  # what groups points: the same detail for every point of a pattern
    ratio: float | None = None  # allocated / needed, for over-allocated and under-sized
    total_bytes: int | None = None


@dataclass
class ClassSweep:
    name: str
    file: str
    outcomes: dict[Point, Outcome]
    live_set: str  # how the live set was had: "derived from apply() views", "not derived: ...", ...

    def by_status(self, status: str) -> list[Point]:
        return [p for p, o in self.outcomes.items() if o.status == status]

    @property
    def verdict(self) -> str:
        for status in (DOUBLE, UNDER, OVER):
            if self.by_status(status):
                return status
        statuses = {o.status for o in self.outcomes.values()}
        if CONSISTENT in statuses:
            return CONSISTENT
        return UNEVALUATED

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


def activations_of(tree: SourceTree) -> tuple[str, ...]:
    """The values of the release's MoEActivation enum, read with ast from its activation module."""
    file = tree.module_file(ACTIVATION_MODULE)
    parsed = tree.modules.get(file) if file else None
    if parsed is None:
        return FALLBACK_ACTIVATIONS
    for node in parsed.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "MoEActivation":
            values = [
                statement.value.value
                for statement in node.body
                if isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ]
            return tuple(values) or FALLBACK_ACTIVATIONS
    return FALLBACK_ACTIVATIONS


def grid(activations: tuple[str, ...], *, unset_allowed: bool, quant: str = DEFAULT_QUANT.name) -> list[Point]:
    """The points of one class (module docstring), each once, sorted; quant: the format of the full product
    (the first one the class takes)."""
    gated = next((a for a in activations if not a.endswith("_no_mul")), "silu")
    plain = next((a for a in activations if a.endswith("_no_mul")), None)
    forms = tuple(a for a in (gated, plain) if a is not None)
    q0 = quant
    points = {
        Point(d, "set", "E·D", q0, act, k, i, e, t)
        for d, e, t, (k, i), act in itertools.product(GRID_D, GRID_E, GRID_T, GRID_KI, forms)
    }
    base = dict(E=BASE_E, T=BASE_T)
    points |= {Point(d, "set", "E·D", q0, act, k, i, **base) for d, (k, i), act in
               itertools.product(GRID_D, GRID_KI, activations)}  # fmt: skip
    points |= {Point(d, "set", "E·D", q.name, act, k, i, **base) for d, (k, i), act, q in
               itertools.product(GRID_D, GRID_KI, forms, QUANT_FORMATS) if q.name != q0}  # fmt: skip
    points |= {Point(d, "set", "EPLB", q0, act, k, i, **base) for d, (k, i), act in
               itertools.product(GRID_D[1:], GRID_KI, forms)}  # fmt: skip
    if unset_allowed:
        points |= {Point(d, "unset", "E·D", q0, act, k, i, **base) for d, (k, i), act in
                   itertools.product(GRID_D, GRID_KI, forms)}  # fmt: skip
    return sorted(points)


def traces_live_set(point: Point, quant: str = DEFAULT_QUANT.name) -> bool:
    """The sub-grid on which apply() is traced: every axis but E and T at the base, and E x T at D = 32."""
    at_base = point.E == BASE_E and point.T == BASE_T and point.D in LIVE_D
    layout = point.D == LIVE_D[-1] and point.dispatchers == "set" and point.experts == "E·D"
    return at_base or (layout and point.quant == quant and not point.activation.endswith("_no_mul"))


# --- the stand-ins of one point ------------------------------------------------------------------------------


def point_attributes(point: Point) -> dict[str, object]:
    args = point.args()
    attributes = standin_attributes(args)
    quant = QUANT_BY_NAME[point.quant]
    fp8, f32 = DTYPES["float8_e4m3fn"], DTYPES["float32"]
    old = cast(StandIn, attributes["quant_config"])
    quant_dtype = fp8 if quant.fp8 else quant.dtype  # nvfp4 is a string in vLLM's quant config too
    attributes["quant_config"] = StandIn(
        "self.quant_config", **{**old.attributes,
        "quant_dtype": quant_dtype, "weight_quant_dtype": quant_dtype, "use_fp8_w8a8": quant.fp8,
        "use_nvfp4_w4a4": quant.dtype == "nvfp4", "is_quantized": quant.dtype is not None,
        "per_act_token_quant": quant.per_token, "per_out_ch_quant": quant.per_token,
        "block_shape": list(quant.block) if quant.block else None},
    )  # fmt: skip
    moe_config = cast(StandIn, attributes["moe_config"])
    if point.experts == "EPLB":
        logical = point.E * point.D - point.D
        attributes["moe_config"] = StandIn(
            "self.moe_config", **{**moe_config.attributes, "num_logical_experts": logical}
        )
    if point.dispatchers == "unset":
        attributes["num_dispatchers"] = None
    E, K, N = args.num_local_experts, args.K, args.N
    attributes.update(
        w1_scale=FakeTensor((E, N, 1), f32) if quant.dtype else None,
        w2_scale=FakeTensor((E, K, 1), f32) if quant.dtype else None,
        w1_zp=None, w2_zp=None, w1_bias=None, w2_bias=None, per_act_token_quant=quant.per_token,
        per_out_ch_quant=quant.per_token, block_shape=list(quant.block) if quant.block else None,
        _permute_scratch=None,
    )  # fmt: skip
    return attributes


def apply_arguments(point: Point, ws13: tuple[int, ...], ws2: tuple[int, ...]) -> dict[str, object]:
    """apply()'s tensors in the batched format: hidden states (E, M, K), w1 (E, N, K), w2 (E, K, N/2 or N)."""
    args = point.args()
    quant = QUANT_BY_NAME[point.quant]
    bf16, f32, i32 = DTYPES["bfloat16"], DTYPES["float32"], DTYPES["int32"]
    act_dtype = DTYPES["float8_e4m3fn"] if quant.fp8 else DTYPES["uint8"] if quant.dtype else bf16
    E, M, K, N, T = args.num_local_experts, args.M, args.K, args.N, args.max_tokens_per_rank
    packed = 2 if quant.dtype == "nvfp4" else 1  # nvfp4 packs two values a byte along the last dim
    return {
        "output": FakeTensor((E, M, K), bf16),
        # nvfp4 experts take bf16 hidden states and quantize them themselves (FlashInfer CuteDSL)
        "hidden_states": FakeTensor((E, M, K), bf16) if packed == 2 else FakeTensor((E, M, K), act_dtype),
        "w1": FakeTensor((E, N, K // packed), act_dtype),
        "w2": FakeTensor((E, K, args.activation_out_dim // packed), act_dtype),
        "topk_weights": FakeTensor((T, TOP_K), f32),
        "topk_ids": FakeTensor((T, TOP_K), DTYPES["int64"]),
        "activation": Activation(point.activation),
        "global_num_experts": args.num_global_experts,
        "expert_map": None,
        "a1q_scale": FakeTensor((E, M, 1), f32) if quant.dtype else None,
        "a2_scale": None,
        "workspace13": WorkspaceTensor("workspace13", ws13, bf16, whole=True),
        "workspace2": WorkspaceTensor("workspace2", ws2, bf16, whole=True),
        "expert_tokens_meta": StandIn(
            "expert_tokens_meta", expert_num_tokens=FakeTensor((E,), i32), expert_num_tokens_cpu=None
        ),
        "expert_tokens_metadata": StandIn(
            "expert_tokens_metadata", expert_num_tokens=FakeTensor((E,), i32), expert_num_tokens_cpu=None
        ),  # the name up to ~0.10
        "apply_router_weight_on_input": False,
        # Up to ~0.10 apply() took the scales and zero points as arguments.
        "w1_scale": FakeTensor((E, N, 1), f32) if quant.dtype else None,
        "w2_scale": FakeTensor((E, K, 1), f32) if quant.dtype else None,
        "w1_zp": None,
        "w2_zp": None,
        "extra_expert_args": None,
    }


class _SweepProgram:
    """The source tree as the interpreter's Program, with quant_utils' QuantKey names as plain strings."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree

    def global_binding(self, file, name):
        return self.tree.global_binding(file, name)

    def module_file(self, module):
        return self.tree.module_file(module)

    def mro(self, cls):
        return self.tree.mro(cls)

    def class_binding(self, cls, name):
        return self.tree.class_binding(cls, name)

    def standin_import(self, module, name):
        if module == QUANT_KEYS_MODULE and name.startswith("k"):
            return name
        return self.tree.standin_import(module, name)


# --- evaluating one class ------------------------------------------------------------------------------------


class _ClassEvaluator:
    def __init__(self, tree: SourceTree, cls: ParsedClass, activations: tuple[str, ...]) -> None:
        self.tree, self.cls, self.program = tree, cls, _SweepProgram(tree)
        self.activations = activations
        self.shapes: dict[Point, object] = {}
        self.support: dict[tuple[str, str], str | None] = {}
        self.constructor: dict[str, str | None] = {}
        self.quant = DEFAULT_QUANT.name  # the format of the full product: the first one the class takes
        self.failed_trace: ViewTrace | None = None
        self.exhausted: str | None = None

    def workspace(self, point: Point):
        """(ws13, ws2, out) or the reason, memoized; once an evaluation runs out of a budget, the class's other
        points carry that reason without being evaluated (a hostile method costs one budget, not one per point)."""
        if self.exhausted is not None:
            return self.exhausted
        if point not in self.shapes:
            interpreter = Interpreter(self.program, DEFAULT_BUDGET)
            try:
                instance = interpreter.instance(self.cls, point_attributes(point))
                method = interpreter.get_attribute(instance, "workspace_shapes")
                result = interpreter.call(method, (), _call_arguments(method, point.args()))
                evaluation = _normalize(result)
                self.shapes[point] = (
                    (evaluation.ws13, evaluation.ws2, evaluation.out) if evaluation.ok else evaluation.reason
                )
            except Unevaluable as error:
                self.shapes[point] = f"workspace_shapes {error}"
            except RecursionError:
                self.shapes[point] = "workspace_shapes nests deeper than Python's own stack allows"
            found = self.shapes[point]
            if isinstance(found, str) and any(limit in found for limit in BUDGET_REASONS):
                self.exhausted = found
        return self.shapes[point]

    def _static(self, method: str, arguments: tuple) -> bool | None:
        """A staticmethod of the class evaluated to a bool, or None when it does not evaluate."""
        interpreter = Interpreter(self.program, DEFAULT_BUDGET)
        try:
            value = interpreter.get_attribute(interpreter.instance(self.cls, {}), method)
            if not isinstance(value, (Function, BoundMethod)):
                return None
            result = interpreter.call(value, arguments, {})
        except (Unevaluable, RecursionError):
            return None
        return result if isinstance(result, bool) else None

    def unsupported(self, point: Point) -> str | None:
        """Why the class says it does not take the point's activation or quantization; None when it does or
        cannot tell."""
        key = (point.activation, point.quant)
        if key not in self.support:
            reason = None
            if point.activation.endswith("_no_mul") and self._static("_supports_no_act_and_mul", ()) is False:
                reason = "_supports_no_act_and_mul() is False: no non-gated activations"
            elif self._static("_supports_activation", (Activation(point.activation),)) is False:
                reason = f"_supports_activation({point.activation}) is False"
            else:
                quant = QUANT_BY_NAME[point.quant]
                keys = (quant.weight_key, quant.activation_key)
                if self._static("_supports_quant_scheme", keys) is False:
                    reason = f"_supports_quant_scheme() is False for {point.quant}"
            self.support[key] = reason
        return self.support[key]

    def constructor_refusal(self, point: Point) -> str | None:
        if point.quant not in self.constructor:
            attributes = point_attributes(point)
            kwargs = {"moe_config": attributes["moe_config"], "quant_config": attributes["quant_config"],
                      "max_num_tokens": point.T, "num_dispatchers": None,
                      # older CutlassExpertsFp8 takes the batched format as a flag (standin_attributes)
                      "use_batched_format": True, "max_experts_per_worker": point.E}  # fmt: skip
            self.constructor[point.quant] = trace_constructor(self.program, self.cls, attributes, kwargs)
        return self.constructor[point.quant]

    def live(self, point: Point, ws13, ws2) -> ViewTrace:
        """apply()'s views at the point; once a trace runs out of budget the class is not traced again (a hostile
        or huge apply() costs one budget per class, not one per point)."""
        if self.failed_trace is not None:
            return self.failed_trace
        trace = trace_apply(self.program, self.cls, point_attributes(point), apply_arguments(point, ws13, ws2))
        if trace.error is not None:
            self.failed_trace = trace
        return trace


def sweep_class(tree: SourceTree, cls: ParsedClass, activations: tuple[str, ...]) -> ClassSweep:
    evaluator = _ClassEvaluator(tree, cls, activations)
    unset_allowed = init_parameter_default(evaluator.program, cls, "num_dispatchers") is None
    gated = next((a for a in activations if not a.endswith("_no_mul")), "silu")
    probe = Point(1, "set", "E·D", DEFAULT_QUANT.name, gated, *GRID_KI[0], BASE_E, BASE_T)
    taken = [q.name for q in QUANT_FORMATS if evaluator.unsupported(dataclasses.replace(probe, quant=q.name)) is None]
    evaluator.quant = taken[0] if taken else DEFAULT_QUANT.name
    outcomes: dict[Point, Outcome] = {}
    live_notes: dict[str, int] = defaultdict(int)
    for point in grid(activations, unset_allowed=unset_allowed, quant=evaluator.quant):
        outcomes[point] = _judge(evaluator, point, live_notes)
    derived = live_notes.pop("derived", 0)
    if derived and not live_notes:
        live_set = f"derived from apply() views at {derived} points"
    elif derived:
        live_set = f"derived from apply() views at {derived} points; not derived at others: " + "; ".join(live_notes)
    else:
        live_set = "not derived: " + ("; ".join(live_notes) or "no point traced")
    return ClassSweep(name=cls.name, file=cls.file.removeprefix("vllm/"), outcomes=outcomes, live_set=live_set)


def _judge(evaluator: _ClassEvaluator, point: Point, live_notes: dict[str, int]) -> Outcome:
    why = evaluator.unsupported(point)
    if why is not None:
        return Outcome(UNSUPPORTED, why)
    if point.dispatchers == "unset":
        refusal = evaluator.constructor_refusal(point)
        if refusal is not None:
            return Outcome(REFUSED, f"the constructor refuses num_dispatchers unset: {refusal}")
    shapes = evaluator.workspace(point)
    if isinstance(shapes, str):
        return Outcome(UNEVALUATED, shapes)
    ws13, ws2, out = shapes
    w = point.args().dtype_bytes
    common = max(math.prod(ws13), math.prod(out)) * w
    total = common + math.prod(ws2) * w
    growth = _d_growth(evaluator, point, shapes)
    if isinstance(growth, Outcome):
        return dataclasses.replace(growth, total_bytes=total)
    double = [name for name, g in growth.items() if point.D > 1 and g == point.D**2]
    if double:
        return Outcome(DOUBLE, f"token dim of {'/'.join(double)} is M·D: D counted twice", total_bytes=total)
    under = _harness_live_set(evaluator, point, total)
    if under is not None:
        return under
    if not traces_live_set(point, evaluator.quant):
        return Outcome(CONSISTENT, "token dim is M = T·D", total_bytes=total)
    trace = evaluator.live(point, ws13, ws2)
    if trace.refusal is not None:
        return Outcome(REFUSED, f"apply() refuses: {trace.refusal}", total_bytes=total)
    needs = {name: trace.need_bytes(name) for name in ("workspace13", "workspace2")}
    allocated = {"workspace13": math.prod(ws13) * w, "workspace2": math.prod(ws2) * w}
    for name, need in needs.items():
        if need is None:
            live_notes[trace.why_not_derived(name).split(" (", 1)[0]] += 1
        elif need > allocated[name]:
            return Outcome(UNDER, f"apply() views {name} to x{need / allocated[name]:.3g} of its size",
                           ratio=allocated[name] / need, total_bytes=total)  # fmt: skip
    if None in needs.values():
        return Outcome(CONSISTENT, "token dim is M = T·D; live set not derived", total_bytes=total)
    live_notes["derived"] += 1
    needed = max(needs["workspace13"], math.prod(out) * w) + needs["workspace2"]
    if needed and total > needed:
        ratio = total / needed
        return Outcome(OVER, f"x{ratio:.3g} of what apply() views", ratio=ratio, total_bytes=total)
    return Outcome(CONSISTENT, "token dim is M = T·D; sized to apply()'s views", total_bytes=total)


def _d_growth(evaluator: _ClassEvaluator, point: Point, shapes) -> dict[str, float] | Outcome:
    """prod(buffer) at the point over prod(buffer) at D = 1, per buffer; an Outcome when that cannot be had."""
    reference = point.reference()
    base = evaluator.workspace(reference) if reference != point else shapes
    if isinstance(base, str):
        return Outcome(UNEVALUATED, f"not evaluated at D = 1 to compare: {base}")
    growth: dict[str, float] = {}
    for name, before, after in (("ws13", base[0], shapes[0]), ("ws2", base[1], shapes[1])):
        b, a = math.prod(before), math.prod(after)
        if b == 0 or a == 0:
            continue
        growth[name] = a / b
        if point.dispatchers == "set" and growth[name] not in (1, point.D, point.D**2):
            return Outcome(UNEVALUATED, f"{name} grows x{growth[name]:g} from D = 1 to D = {point.D}")
    return growth


def _harness_live_set(evaluator: _ClassEvaluator, point: Point, total: int) -> Outcome | None:
    """The batched CUTLASS FP8 path at a gated activation against the live set of harness.core.contract."""
    if evaluator.cls.name not in CUTLASS_BATCHED_NAMES or point.activation.endswith("_no_mul"):
        return None
    floor = live_set_bytes(point.args())
    if total < floor:
        return Outcome(UNDER, f"common + ws2 is x{total / floor:.3g} of the batched CUTLASS live set",
                       ratio=total / floor, total_bytes=total)  # fmt: skip
    return None


@dataclass
class SweepResult:
    label: str
    version: str | None
    origin: str
    activations: tuple[str, ...]
    classes: list[ClassSweep]
    unparsed: dict[str, str]

    @property
    def failed(self) -> list[ClassSweep]:
        return [c for c in self.classes if c.failed]


def sweep(tree: SourceTree, *, class_filter: Callable[[str], bool] | None = None) -> SweepResult:
    activations = activations_of(tree)
    classes = [c for c in tree.batched_classes() if class_filter is None or class_filter(c.name)]
    unparsed = {f: why for f, why in sorted(tree.unparsed.items()) if tree.may_define_batched_classes(f)}
    return SweepResult(
        label=tree.source.label, version=tree.source.version, origin=tree.source.origin, activations=activations,
        classes=[sweep_class(tree, cls, activations) for cls in classes], unparsed=unparsed,
    )  # fmt: skip


# --- grouping points into boxes --------------------------------------------------------------------------------


def boxes(points: Iterable[Point]) -> list[dict[str, tuple]]:
    """A cover of the points by disjoint boxes (a product of a value set per axis), few where the points are a
    product: {axis: sorted values}."""
    tuples = {tuple(getattr(p, axis) for axis in AXES) for p in points}
    return [dict(zip(AXES, (tuple(sorted(v)) for v in box), strict=True)) for box in _boxes(tuples, len(AXES))]


def _boxes(points: set[tuple], width: int) -> list[tuple[frozenset, ...]]:
    if width == 0:
        return [()]
    suffixes: dict[object, set[tuple]] = defaultdict(set)
    for p in points:
        suffixes[p[0]].add(p[1:])
    by_suffixes: dict[frozenset, list] = defaultdict(list)
    for value, rest in suffixes.items():
        by_suffixes[frozenset(rest)].append(value)
    found = []
    for shared, values in by_suffixes.items():
        for sub in _boxes(set(shared), width - 1):
            found.append((frozenset(values), *sub))
    return sorted(found, key=lambda box: tuple(sorted(box[0])) if box else ())


def groups(result: ClassSweep) -> list[tuple[Outcome, list[Point], dict[str, tuple]]]:
    """(an outcome standing for the group, its points, one box) per box of each (status, detail)."""
    by_kind: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for point, outcome in result.outcomes.items():
        by_kind[(outcome.status, outcome.detail)].append(point)
    found = []
    for (status, detail), points in by_kind.items():
        for box in boxes(points):
            members = [p for p in points if all(getattr(p, a) in box[a] for a in AXES)]
            ratios = [r for r in (result.outcomes[p].ratio for p in members) if r is not None]
            worst = (min(ratios) if status == UNDER else max(ratios)) if ratios else None
            found.append((Outcome(status, detail, worst), members, box))
    order = {s: i for i, s in enumerate((DOUBLE, UNDER, OVER, UNEVALUATED, REFUSED, UNSUPPORTED, CONSISTENT))}
    return sorted(found, key=lambda g: (order.get(g[0].status, 9), g[0].detail, -len(g[1])))
