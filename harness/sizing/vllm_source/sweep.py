"""`harness vllm audit --sweep`: every experts class that sizes a workspace, over a grid of layouts and shapes.

    classes: the batched-experts ones (evaluate.batched_classes) and, in the standard format, every class whose body
        defines a concrete workspace_shapes (evaluate.standard_classes); each sized with the N its own
        moe_problem_size derives on its own weights (Marlin: I)
    grid (GRID_*): D x local experts E x T x (K, I) x activation x quantization x num_dispatchers x EPLB
        the full product of D, E, T, (K, I) at one gated and one non-gated activation; every activation of the
        release's MoEActivation (read with ast) x D x (K, I); each quantization format, num_dispatchers unset and
        an EPLB layout (E·D physical experts, one redundant per rank) x D x (K, I)
    per point: workspace_shapes (evaluate.py) -> ws13, ws2, out
        values of the machine: an attribute __init__ takes from the platform, a no-argument function of vLLM used
        as a condition, a truth-valued property of the configuration: both values swept (Point.variant); a
        no-argument function of vLLM that an __init__ building the class asserts equal to an expression
        (AssertedCall): that expression's value at the point, named with the assert's file:line in the variant
        double-count    a buffer grows x D^2 from D = 1 to D (the token dim is M·D, not M = T·D); a size affine
                        in the tokens and rounded up (a padding per expert) counts as xD / xD^2 where it equals
                        what T·D / T·D^2 tokens get at D = 1
        under-sized     the output holds less than the format's (E, M, K) / (M, K); a workspace stays x1 with D
                        while the output grows xD, it grows with T, and it holds less than T·D tokens get at D = 1
                        (the growth check); a view apply() takes of a
                        buffer (views.py) needs more than the buffer holds; or, for CutlassBatchedExpertsFp8 at a
                        gated activation, common + ws2 is below the harness's live set (harness.core.contract)
        over-allocated  common + ws2 is larger than the views need (common = max(ws13, out), which out aliases)
        consistent      none of these, and what apply() uses is derived (here, or on the traced sub-grid)
        not derived     none of these, but what apply() uses is not derived: not a pass
        unevaluated / refused / unsupported   with the reason: the evaluation stopped; the class's apply() or
                        constructor raises or asserts at the point; the class says it does not take the
                        activation or quantization (its own _supports_* methods, where they evaluate)
    findings: a buffer apply() never touches while it costs bytes, with the line that sizes it
    bounds: SweepBudget (CPU time and peak memory of the whole sweep, a share per class, caps on classes and
        activations); what ran out of budget is memoized and reported (SweepResult.limits)

The live set (apply()'s views) is traced on the sub-grid traces_live_set picks; elsewhere a point is judged on its
growth with D alone. Nothing of the release is imported or executed.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import re
import time
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
    Binding,
    BoundMethod,
    Builtin,
    DType,
    FakeTensor,
    Function,
    Interpreter,
    MissingAttribute,
    StandIn,
    Unevaluable,
)
from harness.sizing.vllm_source.views import (
    AssertOperand,
    Opaque,
    TokenCounts,
    ViewTrace,
    WorkspaceTensor,
    init_parameter_default,
    trace_apply,
    trace_constructor,
    trace_to_assert,
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

    @property
    def weight_dtype(self) -> str | None:
        return _key_dtype(self.weight_key)

    @property
    def act_dtype(self) -> str | None:
        """What the activations are quantized to; None for weight-only formats (and bf16)."""
        return _key_dtype(self.activation_key)

    def element_dtype(self, dtype: str | None) -> DType:
        """The tensor dtype of values in `dtype`: fp8 for fp8 / mxfp8, int8, uint8 for the packed 4-bit ones."""
        if dtype in ("float8_e4m3fn", "mxfp8"):
            return DTYPES["float8_e4m3fn"]
        if dtype == "int8":
            return DTYPES["int8"]
        return DTYPES["uint8"] if dtype in PACKED_DTYPES else DTYPES["bfloat16"]

    @property
    def quant_config_dtype(self) -> object:
        """quant_config.quant_dtype: a torch dtype (fp8, int8) or a string (nvfp4, mxfp4, ... in vLLM too)."""
        act = self.act_dtype
        return self.element_dtype(act) if act in ("float8_e4m3fn", "int8") else act


QUANT_FORMATS = (
    QuantFormat("fp8-per-token", "kFp8StaticChannelSym", "kFp8DynamicTokenSym", "float8_e4m3fn", True, None),
    QuantFormat("fp8-per-tensor", "kFp8StaticTensorSym", "kFp8DynamicTensorSym", "float8_e4m3fn", False, None),
    QuantFormat("fp8-block", "kFp8Static128BlockSym", "kFp8Dynamic128Sym", "float8_e4m3fn", False, (128, 128)),
    QuantFormat("nvfp4", "kNvfp4Static", "kNvfp4Dynamic", "nvfp4", False, None),
    QuantFormat("bf16", None, None, None, False, None),
)
DEFAULT_QUANT = QUANT_FORMATS[0]
QUANT_BY_NAME = {q.name: q for q in QUANT_FORMATS}
# Beyond QUANT_FORMATS, a class is swept at the (weight, activation) QuantKey pairs its own _supports_quant_scheme
# names (mxfp4, int8 / int4 weight-only, w4a8 ...): such a format's name is "<weight key>/<activation key or none>",
# and what it stands for is read from vLLM's QuantKey naming (k<Dtype><Static|Dynamic><scale>): the dtype from the
# prefix, per-token scales from "Token" in the activation key, 128-blocks from "128" in it.
KEY_DTYPES = (("kNvfp4", "nvfp4"), ("kMxfp4", "mxfp4"), ("kMxfp8", "mxfp8"), ("kFp8", "float8_e4m3fn"),
              ("kInt8", "int8"), ("kInt4", "int4"), ("kMxint4", "int4"))  # fmt: skip
PACKED_DTYPES = ("nvfp4", "mxfp4", "int4")  # two values a byte along the last dim


def _key_dtype(key: str | None) -> str | None:
    if key is None:
        return None
    return next((dtype for prefix, dtype in KEY_DTYPES if key.startswith(prefix)), None)


def quant_format(name: str) -> QuantFormat:
    """A format of QUANT_FORMATS, or one named "<weight key>/<activation key or none>" (above)."""
    if name in QUANT_BY_NAME:
        return QUANT_BY_NAME[name]
    weight, _, activation = name.partition("/")
    act = None if activation in ("", "none") else activation
    dtype = _key_dtype(act) or _key_dtype(weight)
    block = (128, 128) if act is not None and "128" in act else None
    return QuantFormat(name, weight, act, dtype, act is not None and "Token" in act, block)


MAX_DECLARED_QUANTS = 12  # formats swept per class beyond QUANT_FORMATS


def declared_quant_pairs(tree: SourceTree, cls: ParsedClass) -> tuple[str, ...]:
    """The formats (quant_format names) a class's own _supports_quant_scheme names beyond QUANT_FORMATS, in the order
    written: (weight, activation) tuples of QuantKey names (module-level lists the method reads count too), and the
    keys it compares its weight and activation parameters with (`weight_key in (kInt4Static, ...)`, `activation_key
    is None`), paired. Candidates only: the sweep keeps those the method, evaluated, accepts."""
    found = tree.find_method(cls, "_supports_quant_scheme")
    if found is None:
        return ()
    owner, method = found
    nodes: list[ast.AST] = [method]
    for node in ast.walk(method):
        if isinstance(node, ast.Name) and not node.id.startswith("k"):
            binding = tree.global_binding(owner.file, node.id)
            if binding is not None and binding.kind == "value" and binding.node is not None:
                nodes.append(binding.node)
    standard = {(q.weight_key, q.activation_key) for q in QUANT_FORMATS}
    names: dict[str, None] = {}
    for root in nodes:
        for node in ast.walk(root):
            if not isinstance(node, ast.Tuple) or len(node.elts) != 2:
                continue
            keys = [e.id if isinstance(e, ast.Name) and e.id.startswith("k") else None
                    if isinstance(e, ast.Constant) and e.value is None else "" for e in node.elts]  # fmt: skip
            weight, activation = keys
            if not weight or activation == "" or (weight, activation) in standard or _key_dtype(weight) is None:
                continue
            names[f"{weight}/{activation or 'none'}"] = None
    params = [a.arg for a in method.args.args if a.arg not in ("self", "cls")]
    compared: dict[str, dict[str | None, None]] = {name: {} for name in params[:2]}
    for node in ast.walk(method):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in compared:
            for right in node.comparators:
                for leaf in ast.walk(right):
                    if isinstance(leaf, ast.Name) and leaf.id.startswith("k"):
                        compared[node.left.id][leaf.id] = None
                    elif isinstance(leaf, ast.Constant) and leaf.value is None:
                        compared[node.left.id][None] = None
    if len(params) >= 2:
        for weight, activation in itertools.product(compared[params[0]], compared[params[1]] or {None: None}):
            if weight is not None and (weight, activation) not in standard and _key_dtype(weight) is not None:
                names[f"{weight}/{activation or 'none'}"] = None
    return tuple(names)[:MAX_DECLARED_QUANTS]


CONSISTENT, DOUBLE, UNDER, OVER = "consistent", "double-count", "under-sized", "over-allocated"
UNEVALUATED, REFUSED, UNSUPPORTED = "unevaluated", "refused", "unsupported"
NOT_DERIVED = "not derived"  # neither apply()'s views nor a growth check can judge the point: not a pass
BATCHED, STANDARD = "batched", "standard"
MARLIN_UTILS_MODULE = "vllm.model_executor.layers.quantization.utils.marlin_utils"
MARLIN_TILE = 16  # marlin_utils.marlin_moe_intermediate_size: N = w2_packed.size(1) * marlin_tile_size (16)
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
    variant: str = ""  # the runtime flags the class reads, as swept: "is_sm100=True" (init_attribute)

    def __hash__(self) -> int:
        """The dataclass's hash (of the fields' tuple), computed once per point: points key every memo of the sweep."""
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.D, self.dispatchers, self.experts, self.quant, self.activation, self.K, self.I, self.E,
                          self.T, self.variant))  # fmt: skip
            object.__setattr__(self, "_hash", found)
        return cast(int, found)

    def args(self) -> SizingArgs:
        found = self.__dict__.get("_args")  # built once per point (SizingArgs is frozen); not a field
        if found is None:
            found = SizingArgs(
                max_tokens_per_rank=self.T, num_dispatchers=self.D, num_local_experts=self.E,
                num_global_experts=self.E * self.D, hidden_size=self.K, intermediate_size=self.I, top_k=TOP_K,
                activation=self.activation,
            )  # fmt: skip
            object.__setattr__(self, "_args", found)
        return cast(SizingArgs, found)

    @property
    def region(self) -> str:
        """Where K falls against N (N = 2I for gated activations, I for *_no_mul)."""
        n = self.args().N
        return "K<N/2" if 2 * self.K < n else "K>N" if self.K > n else "K=N" if self.K == n else "N/2<=K<N"

    def reference(self) -> Point:
        """The same point at D = 1 with num_dispatchers set and no EPLB: what D scales from."""
        return Point(1, "set", "E·D", self.quant, self.activation, self.K, self.I, self.E, self.T, self.variant)

    def weights_key(self) -> Point:
        """The same point at D = 1 and T = BASE_T: what a weight dimension (N, K) is derived at (built once, as
        args())."""
        found = self.__dict__.get("_weights_key")
        if found is None:
            found = Point(1, self.dispatchers, self.experts, self.quant, self.activation, self.K, self.I, self.E,
                          BASE_T, self.variant)  # fmt: skip
            object.__setattr__(self, "_weights_key", found)
        return cast(Point, found)


AXES = tuple(f.name for f in dataclasses.fields(Point))


@dataclass(frozen=True)
class Outcome:
    status: str
    detail: str  # what groups points: the same detail for every point of a pattern
    ratio: float | None = None  # allocated / needed, for over-allocated and under-sized
    total_bytes: int | None = None
    shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None  # ws13, ws2, out
    N: int | None = None
    uses: tuple[int | None, int | None] | None = None  # bytes of ws13, ws2 apply()'s views need (None: not derived)


@dataclass(frozen=True)
class Finding:
    """Something named on its own, not only in a point group: a buffer apply() never touches."""

    kind: str  # "unused-buffer"
    buffer: str  # "workspace13" | "workspace2"
    file: str
    line: int
    detail: str
    bytes_at: dict[str, int] = dataclasses.field(default_factory=dict)  # reference deployment -> bytes
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclass
class ClassSweep:
    name: str
    file: str
    outcomes: dict[Point, Outcome]
    live_set: str  # how the live set was had: "derived from apply() views", "not derived: ...", ...
    format: str = BATCHED
    n_rule: str = "N = w1.size(1)"  # how the class's moe_problem_size derives N
    findings: list[Finding] = dataclasses.field(default_factory=list)

    def by_status(self, status: str) -> list[Point]:
        return [p for p, o in self.outcomes.items() if o.status == status]

    @property
    def verdict(self) -> str:
        for status in (DOUBLE, UNDER, OVER):
            if self.by_status(status):
                return status
        statuses = {o.status for o in self.outcomes.values()}
        for status in (CONSISTENT, NOT_DERIVED):
            if status in statuses:
                return status
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


def grid(activations: tuple[str, ...], *, unset_allowed: bool, quant: str = DEFAULT_QUANT.name,
         forms: tuple[str, ...] | None = None, quants: tuple[str, ...] = ()) -> list[Point]:  # fmt: skip
    """The points of one class (module docstring), each once, sorted; quant: the format of the full product
    (the first one the class takes); forms: its gated and non-gated activation (the first ones the class takes;
    by default the release's first of each); quants: formats swept beyond QUANT_FORMATS (declared_quant_pairs)."""
    if forms is None:
        forms = default_forms(activations)
    q0 = quant
    points = {
        Point(d, "set", "E·D", q0, act, k, i, e, t)
        for d, e, t, (k, i), act in itertools.product(GRID_D, GRID_E, GRID_T, GRID_KI, forms)
    }

    points |= {Point(d, "set", "E·D", q0, act, k, i, E=BASE_E, T=BASE_T) for d, (k, i), act in
               itertools.product(GRID_D, GRID_KI, activations)}  # fmt: skip
    points |= {Point(d, "set", "E·D", q, act, k, i, E=BASE_E, T=BASE_T) for d, (k, i), act, q in
               itertools.product(GRID_D, GRID_KI, forms, (*(q.name for q in QUANT_FORMATS), *quants))
               if q != q0}  # fmt: skip
    points |= {Point(d, "set", "EPLB", q0, act, k, i, E=BASE_E, T=BASE_T) for d, (k, i), act in
               itertools.product(GRID_D[1:], GRID_KI, forms)}  # fmt: skip
    if unset_allowed:
        points |= {Point(d, "unset", "E·D", q0, act, k, i, E=BASE_E, T=BASE_T) for d, (k, i), act in
                   itertools.product(GRID_D, GRID_KI, forms)}  # fmt: skip
    return sorted(points)


def default_forms(activations: tuple[str, ...]) -> tuple[str, ...]:
    """The release's first gated and first non-gated (*_no_mul) activation."""
    gated = next((a for a in activations if not a.endswith("_no_mul")), "silu")
    plain = next((a for a in activations if a.endswith("_no_mul")), None)
    return tuple(a for a in (gated, plain) if a is not None)


def traces_live_set(point: Point, quant: str = DEFAULT_QUANT.name) -> bool:
    """The sub-grid on which apply() is traced: every axis but E and T at the base, and E x T at D = 32."""
    at_base = point.E == BASE_E and point.T == BASE_T and point.D in LIVE_D
    layout = point.D == LIVE_D[-1] and point.dispatchers == "set" and point.experts == "E·D"
    return at_base or (layout and point.quant == quant and not point.activation.endswith("_no_mul"))


# --- the stand-ins of one point ------------------------------------------------------------------------------


def point_attributes(point: Point) -> dict[str, object]:
    args = point.args()
    attributes = standin_attributes(args)
    quant = quant_format(point.quant)
    f32 = DTYPES["float32"]
    old = cast(StandIn, attributes["quant_config"])
    act, weight = quant.act_dtype, quant.weight_dtype
    weight_dtype = quant.element_dtype(weight) if weight in ("float8_e4m3fn", "int8") else weight
    attributes["quant_config"] = StandIn(
        "self.quant_config", **{**old.attributes,
        "quant_dtype": quant.quant_config_dtype, "weight_quant_dtype": weight_dtype,
        "use_fp8_w8a8": act == weight == "float8_e4m3fn", "use_int8_w8a8": act == weight == "int8",
        "use_int8_w8a16": weight == "int8" and act is None, "use_int4_w4a16": weight == "int4" and act is None,
        "use_mxfp4_w4a16": weight == "mxfp4" and act is None, "use_mxfp4_w4a4": act == weight == "mxfp4",
        "use_nvfp4_w4a4": act == weight == "nvfp4", "is_quantized": weight is not None,
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


MARLIN, PLAIN = "marlin", "plain"


def weights(point: Point, layout: str) -> tuple[FakeTensor, FakeTensor]:
    """w1 and w2 as the class holds them. plain: w1 (E, N, K), w2 (E, K, N/2 or N), nvfp4 packing two values a byte
    along the last dim. marlin (vLLM's marlin_utils tile layout, a tile of 16 along the reduced dim, 32 / bits values a
    word): w13 (E, K/16, N13·16·bits/32), w2 (E, I/16, K·16·bits/32) with N13 = 2I gated, I non-gated."""
    args = point.args()
    quant = quant_format(point.quant)
    weight_dtype = quant.element_dtype(quant.weight_dtype)
    E, K, N = args.num_local_experts, args.K, args.N
    if layout == MARLIN:
        bits = 4 if quant.weight_dtype in PACKED_DTYPES else 8
        i32 = DTYPES["int32"]
        return (
            FakeTensor((E, K // MARLIN_TILE, N * MARLIN_TILE * bits // 32), i32),
            FakeTensor((E, args.intermediate_size // MARLIN_TILE, K * MARLIN_TILE * bits // 32), i32),
        )
    packed = 2 if quant.weight_dtype in PACKED_DTYPES else 1  # two 4-bit values a byte along the last dim
    return (FakeTensor((E, N, K // packed), weight_dtype),
            FakeTensor((E, K, args.activation_out_dim // packed), weight_dtype))  # fmt: skip


def token_shape(point: Point, fmt: str, width: int) -> tuple[int, ...]:
    """The experts' input/output rows: (E, M, width) in the batched format, (M, width) in the standard one."""
    args = point.args()
    return (args.num_local_experts, args.M, width) if fmt == BATCHED else (args.M, width)


def apply_arguments(point: Point, ws13: tuple[int, ...], ws2: tuple[int, ...], fmt: str = BATCHED,
                    layout: str = PLAIN, *, packed: bool = False) -> dict[str, object]:  # fmt: skip
    """apply()'s tensors: hidden states (E, M, K) batched or (M, K) standard (packed: (.., K/2) bytes, two 4-bit
    values each, as the prepare step quantizes them), the class's weights, the workspaces."""
    args = point.args()
    quant = quant_format(point.quant)
    bf16, f32, i32 = DTYPES["bfloat16"], DTYPES["float32"], DTYPES["int32"]
    act_dtype = quant.element_dtype(quant.act_dtype)
    E, K, N = args.num_local_experts, args.K, args.N
    # Rows routed to this rank: the standard format's topk_ids are (M, top_k); the batched format's the dispatcher's.
    rows = args.M if fmt == STANDARD else args.max_tokens_per_rank
    # nvfp4 and Marlin (weight-only) experts take bf16 hidden states and quantize them themselves.
    # Weight-only formats take them unquantized.
    hidden_dtype = bf16 if quant.act_dtype in ("nvfp4", "mxfp4", None) or layout == MARLIN else act_dtype
    w1, w2 = weights(point, layout)
    return {
        "output": FakeTensor(token_shape(point, fmt, K), bf16),
        "hidden_states": FakeTensor(token_shape(point, fmt, K // 2), DTYPES["uint8"])
        if packed
        else FakeTensor(token_shape(point, fmt, K), hidden_dtype),
        "w1": w1,
        "w2": w2,
        "topk_weights": FakeTensor((rows, TOP_K), f32),
        "topk_ids": FakeTensor((rows, TOP_K), DTYPES["int64"]),
        "activation": Activation(point.activation),
        "global_num_experts": args.num_global_experts,
        "expert_map": None,
        "a1q_scale": FakeTensor(token_shape(point, fmt, 1), f32) if quant.act_dtype else None,
        "a2_scale": None,
        "workspace13": WorkspaceTensor("workspace13", ws13, bf16, whole=True),
        "workspace2": WorkspaceTensor("workspace2", ws2, bf16, whole=True),
        "expert_tokens_meta": StandIn(
            "expert_tokens_meta", expert_num_tokens=TokenCounts((E,), i32, args.M), expert_num_tokens_cpu=None
        )
        if fmt == BATCHED
        else None,
        "expert_tokens_metadata": StandIn(
            "expert_tokens_metadata", expert_num_tokens=TokenCounts((E,), i32, args.M), expert_num_tokens_cpu=None
        )
        if fmt == BATCHED
        else None,
        "apply_router_weight_on_input": False,
        # Up to ~0.10 apply() took the scales and zero points as arguments.
        "w1_scale": FakeTensor((E, N, 1), f32) if quant.dtype else None,
        "w2_scale": FakeTensor((E, K, 1), f32) if quant.dtype else None,
        "w1_zp": None,
        "w2_zp": None,
        "extra_expert_args": None,
    }


def _marlin_intermediate_size(interp, w1, w2):
    """marlin_utils.marlin_moe_intermediate_size: `return w2_packed.size(1) * marlin_tile_size` (16)."""
    if not isinstance(w2, FakeTensor) or len(w2.shape) < 2:
        raise Unevaluable("marlin_moe_intermediate_size of something that is not a packed weight")
    return w2.shape[1] * MARLIN_TILE


MARLIN_INTERMEDIATE_SIZE = Builtin("marlin_moe_intermediate_size", _marlin_intermediate_size)


# --- attributes the class's own __init__ assigns ------------------------------------------------------------------

# Names whose values the machine decides (the platform, torch's device ops, the environment), not the config.
RUNTIME_ROOTS = ("current_platform", "torch", "envs", "os")
MAX_DERIVED = 6  # attributes derived per class
MAX_FLAGS = 2  # runtime flags swept per class (2^flags variants)
MISSING_SELF = re.compile(r"reads self\.(\w+), which the stand-in self does not carry")
MAX_REEXPORTS = 8  # imports followed to find the class a delegating __init__ builds
QUANT_CONFIG = "quant_config"  # its properties are the point's quant format's (point_attributes), not the machine's
MISSING_CONFIG = re.compile(r"reads self\.(\w+)\.(\w+), which the stand-in does not carry")
UNIMPORTED = re.compile(r"uses the name '(\w+)', which is only defined when vLLM is imported")


def zero_argument_calls(tree: SourceTree, cls: ParsedClass, name: str) -> bool:
    """The class's file calls `name()` with no arguments and only as a condition (an if / while / conditional
    expression's test, an operand of and / or / not): a truth value of nothing the config holds, so of the machine
    (is_deep_gemm_e8m0_used()), swept at both values."""
    parsed = tree.modules.get(cls.file)
    if parsed is None:
        return False
    conditions: set[int] = set()
    for node in ast.walk(parsed.tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            conditions.add(id(node.test))
        elif isinstance(node, ast.BoolOp):
            conditions.update(id(v) for v in node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            conditions.add(id(node.operand))
    calls = [n for n in ast.walk(parsed.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == name]  # fmt: skip
    return bool(calls) and all(not c.args and not c.keywords and id(c) in conditions for c in calls)


def config_flag(tree: SourceTree, cls: ParsedClass, config: str, name: str) -> str | None:
    """Where the release defines self.<config>.<name> as a truth value of the deployment: the class that the
    __init__ parameter <config> is annotated with has a property <name> whose every return is a comparison, a
    boolean operation or a boolean constant, or reads the same-named such property of another class of its module
    (FusedMoEConfig.use_mori_kernels returns moe_parallel_config.use_mori_kernels, an `and` of the backend's name).
    None when it is not one: then the stand-in's missing attribute stays the reason."""
    annotation = None
    for owner in tree.mro(cls):
        binding = tree.class_binding(owner, "__init__")
        if binding is not None and isinstance(binding.node, ast.FunctionDef):
            arguments = binding.node.args
            found = [a for a in (*arguments.args, *arguments.kwonlyargs) if a.arg == config]
            if found:
                annotation = found[0].annotation
                break
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body if annotation.value.isidentifier() else None
    if not isinstance(annotation, ast.Name):
        return None
    candidates = tree.class_named(annotation.id)
    if len(candidates) != 1:
        return None
    config_cls = candidates[0]
    return _truth_property(tree, config_cls, name, depth=0)


def _truth_property(tree: SourceTree, config_cls: ParsedClass, name: str, depth: int) -> str | None:
    prop = next((n for n in config_cls.node.body if isinstance(n, ast.FunctionDef) and n.name == name
                 and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)), None)  # fmt: skip
    if prop is None or depth > 2:
        return None
    returns = [n.value for n in ast.walk(prop) if isinstance(n, ast.Return)]
    if not returns:
        return None
    where = f"{config_cls.name}.{name}, {config_cls.file.rsplit('/', 1)[-1]} line {prop.lineno}"
    for value in returns:
        if (
            isinstance(value, (ast.BoolOp, ast.Compare))
            or (isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not))
            or (isinstance(value, ast.Constant) and isinstance(value.value, bool))
        ):
            continue
        if isinstance(value, ast.Attribute) and value.attr == name:
            others = [c for same_name in tree.classes_by_name.values() for c in same_name
                      if c.file == config_cls.file and c.key != config_cls.key
                      and _truth_property(tree, c, name, depth + 1) is not None]  # fmt: skip
            if len(others) == 1:
                continue
        return None
    return where


@dataclass(frozen=True)
class InitAttribute:
    """`self.<name> = <expression>`, a top-level statement of the __init__ the class runs (the first in its MRO
    that assigns the name), with the statements before it."""

    name: str
    owner: ParsedClass
    init: ast.FunctionDef
    expression: ast.expr
    prelude: tuple[ast.stmt, ...]

    @property
    def where(self) -> str:
        return f"{self.owner.file.rsplit('/', 1)[-1]} line {self.expression.lineno}"

    @property
    def text(self) -> str:
        return f"self.{self.name} = {ast.unparse(self.expression)}"

    def runtime(self) -> bool:
        """The expression (or a name the prelude assigns it from) reads a value of the machine (RUNTIME_ROOTS)."""
        roots = {n.id for n in ast.walk(self.expression) if isinstance(n, ast.Name)}
        for statement in self.prelude:
            if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id in roots
                                                         for t in statement.targets):  # fmt: skip
                roots |= {n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name)}
        return bool(roots & set(RUNTIME_ROOTS))


def _assigns_self(statement: ast.AST, name: str) -> ast.expr | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, value = statement.target, statement.value
    else:
        return None
    if isinstance(target, ast.Attribute) and target.attr == name and isinstance(target.value, ast.Name):
        return value if target.value.id == "self" else None
    return None


def init_attribute(tree: SourceTree, cls: ParsedClass, name: str) -> InitAttribute | str:
    """Where the class's __init__ assigns self.<name>, or why that is not followed."""
    for owner in tree.mro(cls):
        binding = tree.class_binding(owner, "__init__")
        if binding is None or not isinstance(binding.node, ast.FunctionDef):
            continue
        init = binding.node
        found = [(i, v) for i, statement in enumerate(init.body) if (v := _assigns_self(statement, name)) is not None]
        if found:
            index, expression = found[-1]
            return InitAttribute(name, owner, init, expression, tuple(init.body[:index]))
        nested = [n for n in ast.walk(init) if isinstance(n, ast.stmt) and _assigns_self(n, name) is not None]
        if nested:
            return (f"{owner.name}.__init__ assigns self.{name} only inside a block "
                    f"({owner.file.rsplit('/', 1)[-1]} line {nested[0].lineno})")  # fmt: skip
    return f"no parsed __init__ of {cls.name} assigns self.{name}"


# --- values an __init__ asserts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AssertedCall:
    """`assert <operand> == name()` (either way round) in an __init__ that building the class runs: its own (through
    super().__init__) or that of an experts class its __init__ builds and hands on (a delegate). name() takes no
    argument and is imported from a module of vLLM outside the parsed files, so nothing but the assert tells its
    value: a class vLLM builds has name() == operand, evaluated at the assert with the point's configuration."""

    module: str
    name: str  # as the module defines it
    runner: ParsedClass  # the class whose construction runs the assert: the swept class or a delegate it builds
    owner: ParsedClass  # the class whose __init__ holds the assert
    node: ast.Assert
    operand: ast.expr

    @property
    def where(self) -> str:
        return f"{self.owner.file.rsplit('/', 1)[-1]}:{self.node.lineno}"

    @property
    def text(self) -> str:
        return ast.unparse(self.node.test)

    @property
    def part(self) -> str:
        """The point's variant part: the function's value is the operand's, as asserted at file:line."""
        operand = ast.unparse(self.operand)
        shown = operand if len(operand) <= 60 and "," not in operand else "the asserted value"
        return f"{self.name}()={shown} (asserted at {self.where})"


MAX_DELEGATES = 4  # experts classes followed per class for asserts in their __init__


def init_chain(tree: SourceTree, cls: ParsedClass) -> list[tuple[ParsedClass, ast.FunctionDef]]:
    """The __init__s building cls runs: the first in its MRO, then each next one a `super().__init__(...)` calls."""
    chain: list[tuple[ParsedClass, ast.FunctionDef]] = []
    for owner in tree.mro(cls):
        binding = tree.class_binding(owner, "__init__")
        if binding is None or not isinstance(binding.node, ast.FunctionDef):
            continue
        if chain and not any(_is_super_init(n) for n in ast.walk(chain[-1][1])):
            break
        chain.append((owner, binding.node))
    return chain


def _is_super_init(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super")  # fmt: skip


@dataclass(frozen=True)
class Construction:
    """`Class(a, b)` in a straight-line statement of an __init__ (an expression statement or an assignment, not under
    an if, loop or try): a parsed class built from the __init__'s own parameters, passed on by the same names, with
    no keywords. keyword: the argument it is handed to a top-level `super().__init__(...)` as, if it is."""

    call: ast.Call
    target: ParsedClass
    keyword: str | None


def constructions(tree: SourceTree, owner: ParsedClass, init: ast.FunctionDef) -> list[Construction]:
    """The Constructions of owner's __init__ (`init`), in the order written; read once (kept in tree.memo)."""
    key = ("constructions", *owner.key)
    found = tree.memo.get(key)
    if not (isinstance(found, tuple) and found[0] is init):
        found = tree.memo[key] = (init, _constructions(tree, owner, init))
    return cast(list[Construction], found[1])


def _constructions(tree: SourceTree, owner: ParsedClass, init: ast.FunctionDef) -> list[Construction]:
    parameters = {a.arg for a in (*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs)[1:]}
    found: list[Construction] = []
    for statement in init.body:
        if not isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign)):
            continue
        handed: dict[int, str] = {}  # id of a keyword's value -> the keyword, for `super().__init__(name=Class(..))`
        if isinstance(statement, ast.Expr) and _is_super_init(statement.value):
            handed = {id(k.value): k.arg for k in cast(ast.Call, statement.value).keywords if k.arg is not None}
        for node in ast.walk(statement):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and not node.keywords
                and all(isinstance(a, ast.Name) and a.id in parameters for a in node.args)
            ):
                continue  # fmt: skip
            target = class_of(tree, owner.file, tree.global_binding(owner.file, node.func.id))
            if target is not None:
                found.append(Construction(node, target, handed.get(id(node))))
    return found


def built_classes(tree: SourceTree, cls: ParsedClass) -> list[ParsedClass]:
    """The parsed classes cls's __init__s build on every path (Construction), whose own __init__ takes the
    arguments by the names passed."""
    found: dict[tuple[str, str], ParsedClass] = {}
    for owner, init in init_chain(tree, cls):
        for built in constructions(tree, owner, init):
            target = built.target
            if target.key == cls.key:
                continue
            target_init = init_chain(tree, target)
            names = [a.arg for a in (*target_init[0][1].args.posonlyargs, *target_init[0][1].args.args)[1:]] \
                if target_init else []  # fmt: skip
            if [cast(ast.Name, a).id for a in built.call.args] == names[: len(built.call.args)]:
                found.setdefault(target.key, target)
    return list(found.values())[:MAX_DELEGATES]


def class_of(tree: SourceTree, file: str, binding: Binding | None, depth: int = 0) -> ParsedClass | None:
    """The parsed class a module-level name of file is (defined there or imported from a parsed module, through at
    most MAX_REEXPORTS re-exports: a cycle of imports ends)."""
    if binding is None or depth > MAX_REEXPORTS:
        return None
    if binding.kind == "class":
        return cast(ParsedClass, binding.cls)
    if binding.kind == "import":
        module_file = tree.module_file(binding.module)
        if module_file is not None:
            return class_of(tree, module_file, tree.global_binding(module_file, binding.original), depth + 1)
    return None


def asserted_calls(tree: SourceTree, cls: ParsedClass) -> dict[tuple[str, str], AssertedCall]:
    """(module, name) -> the first AssertedCall of building cls: its own __init__ chain first, then its delegates'."""
    found: dict[tuple[str, str], AssertedCall] = {}
    for runner in (cls, *built_classes(tree, cls)):
        for owner, init in init_chain(tree, runner):
            for node in ast.walk(init):
                if not (
                    isinstance(node, ast.Assert)
                    and isinstance(node.test, ast.Compare)
                    and len(node.test.ops) == 1
                    and isinstance(node.test.ops[0], ast.Eq)
                ):
                    continue  # fmt: skip
                left, right = node.test.left, node.test.comparators[0]
                for call, operand in ((left, right), (right, left)):
                    if not (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and not call.args
                        and not call.keywords
                    ):
                        continue  # fmt: skip
                    binding = tree.global_binding(owner.file, call.func.id)
                    if (
                        binding is None
                        or binding.kind != "import"
                        or not binding.module.startswith("vllm.")
                        or tree.module_file(binding.module) is not None
                    ):
                        continue
                    key = (binding.module, binding.original)
                    found.setdefault(key, AssertedCall(binding.module, binding.original, runner, owner, node, operand))
    return found


def indexed_call(tree: SourceTree, module: str, name: str) -> str | None:
    """Where a parsed file indexes or unpacks what `name()` (imported from module) returns, `name()[0]` or
    `a, b = name()`: the release's own code takes it for a sequence, never None. None where no file does. The tree
    is walked once per (module, name): the answer is kept in tree.memo."""
    key = ("indexed_call", module, name)
    if key not in tree.memo:
        tree.memo[key] = _indexed_call(tree, module, name)
    return cast("str | None", tree.memo[key])


def _indexed_call(tree: SourceTree, module: str, name: str) -> str | None:
    for file, parsed in tree.modules.items():
        local = [alias for alias, imported in parsed.imported_names.items() if imported == (module, name)]
        if not local:
            continue
        for node in ast.walk(parsed.tree):
            if isinstance(node, ast.Subscript) or (
                isinstance(node, ast.Assign) and isinstance(node.targets[0], (ast.Tuple, ast.List))
            ):
                call = node.value
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in local:
                    return f"{file.rsplit('/', 1)[-1]}:{node.lineno}"
    return None


class _SweepProgram:
    """The source tree as the interpreter's Program, with quant_utils' QuantKey names as plain strings."""

    def __init__(self, tree: SourceTree, overrides: dict[str, object] | None = None,
                 imports: dict[tuple[str, str], object] | None = None) -> None:  # fmt: skip
        self.tree = tree
        self.overrides = overrides or {}  # imported names a variant sets: a runtime flag function's value
        self.imports = imports or {}  # (module, name) -> its value: a function whose value an __init__ asserts

    def global_binding(self, file, name):
        return self.tree.global_binding(file, name)

    def module_file(self, module):
        return self.tree.module_file(module)

    def mro(self, cls):
        return self.tree.mro(cls)

    def class_binding(self, cls, name):
        return self.tree.class_binding(cls, name)

    def standin_import(self, module, name):
        if (module, name) in self.imports:
            return self.imports[(module, name)]
        if name in self.overrides:
            return self.overrides[name]
        if module == QUANT_KEYS_MODULE and name.startswith("k"):
            return name
        if module == MARLIN_UTILS_MODULE and name == "marlin_moe_intermediate_size":
            return MARLIN_INTERMEDIATE_SIZE
        return self.tree.standin_import(module, name)


# --- evaluating one class ------------------------------------------------------------------------------------


class _ClassEvaluator:
    def __init__(self, tree: SourceTree, cls: ParsedClass, activations: tuple[str, ...], fmt: str = BATCHED,
                 deadline: Deadline | None = None) -> None:  # fmt: skip
        self.tree, self.cls, self.program = tree, cls, _SweepProgram(tree)
        self.activations = activations
        self.format = fmt
        self.deadline = deadline
        self.layout = _weight_layout(tree, cls)
        self.n_values: dict[Point, int | str] = {}
        self.k_values: dict[Point, int] = {}  # the K moe_problem_size derives (packed_input), per n_values' key
        self.packed: dict[tuple[str, str], bool] = {}  # (quant, variant) -> packed_input
        sizing = tree.find_method(cls, "workspace_shapes")
        self.sizes_by_input_quant = sizing is not None and any(
            isinstance(n, ast.Attribute) and n.attr == "expects_unquantized_inputs" for n in ast.walk(sizing[1])
        )
        self.shapes: dict[Point, object] = {}
        self.support: dict[tuple[str, str], str | None] = {}
        self.constructor: dict[str, str | None] = {}
        self.quant = DEFAULT_QUANT.name  # the format of the full product: the first one the class takes
        self.failed_trace: ViewTrace | None = None
        self.trace = True  # False: apply() is not traced
        self.exhausted_methods: set[str] = set()
        self.refusals: dict[Point, str | None] = {}  # apply()'s refusal at each traced point
        self.exhausted: str | None = None
        self.derived: dict[str, InitAttribute] = {}  # attributes of self the class's __init__ assigns, derived
        self.flags: dict[str, InitAttribute] = {}  # ... that the machine decides: swept at both values (variants)
        self.underivable: dict[str, str] = {}  # ... and why they are not derived
        self.call_flags: dict[str, str] = {}  # functions of the machine workspace_shapes calls, imported from vLLM
        # truth-valued properties of a configuration class the stand-in config does not carry (the deployment's
        # all-to-all backend, say): "moe_config.use_mori_kernels" -> where the release defines it; both values swept
        self.config_flags: dict[str, str] = {}
        self.checked_calls: set[str] = set()
        self._programs: dict[str, _SweepProgram] = {}  # variant -> the program of its runtime flag values
        self._asserted_programs: dict[Point, _SweepProgram] = {}  # point -> ... and its asserted calls' values
        self._attributes: dict[Point, tuple[int, dict[str, object]]] = {}  # point -> (len(derived), attributes)
        # functions of vLLM whose value only an assert of __init__ tells (AssertedCall): each takes the asserted value
        # at each point, and those workspace_shapes or apply() call are named in the points' variant
        self.asserted = asserted_calls(tree, cls)
        self.asserted_used: set[tuple[str, str]] = set()
        self._asserted: dict[tuple[Point, tuple[str, str]], AssertOperand] = {}

    def workspace(self, point: Point):
        """(ws13, ws2, out) or the reason, memoized; once an evaluation runs out of a budget, the class's other
        points carry that reason without being evaluated (a hostile method costs one budget, not one per point)."""
        if self.exhausted is not None:
            return self.exhausted
        if point not in self.shapes:
            if self.deadline is not None and (spent := self.deadline.spent()) is not None:
                self.exhausted = spent
                return spent
            for _ in range(MAX_DERIVED + 1):  # each pass derives one more attribute of __init__, or ends
                if not self._evaluate(point):
                    break
            found = self.shapes[point]
            if isinstance(found, str) and any(limit in found for limit in BUDGET_REASONS):
                self.exhausted = found
        return self.shapes[point]

    def program_for(self, point: Point, *, asserted: bool = True) -> _SweepProgram:
        """The program of the point: with the values its variant gives the runtime flag functions, and (asserted)
        the value each function of self.asserted takes at the point."""
        calls = {part.removesuffix("()=True").removesuffix("()=False"): part.endswith("=True")
                 for part in point.variant.split(",") if part.endswith(("()=True", "()=False"))}  # fmt: skip
        if not calls and not (asserted and self.asserted):
            return self.program
        if point.variant not in self._programs:
            overrides: dict[str, object] = {
                name: Builtin(name, lambda interp, value=value: value) for name, value in calls.items()
            }
            self._programs[point.variant] = _SweepProgram(self.tree, overrides)
        program = self._programs[point.variant]
        if not (asserted and self.asserted):
            return program
        if point not in self._asserted_programs:
            imports: dict[tuple[str, str], object] = {
                key: Builtin(key[1], lambda interp, key=key: self.asserted_value(point, key)) for key in self.asserted
            }
            self._asserted_programs[point] = _SweepProgram(self.tree, program.overrides, imports)
        return self._asserted_programs[point]

    def asserted_operand(self, point: Point, key: tuple[str, str]) -> AssertOperand:
        """The asserted call's operand where building the class at the point reaches its assert (memoized)."""
        if (point, key) not in self._asserted:
            spec = self.asserted[key]
            attributes = self.attributes(point)
            kwargs = {"moe_config": attributes["moe_config"], "quant_config": attributes["quant_config"],
                      "max_num_tokens": point.T, "num_dispatchers": attributes.get("num_dispatchers")}  # fmt: skip
            self._asserted[(point, key)] = trace_to_assert(self.program_for(point, asserted=False), spec.runner,
                                                           attributes, kwargs, spec.node, spec.operand)  # fmt: skip
        return self._asserted[(point, key)]

    def asserted_value(self, point: Point, key: tuple[str, str]) -> object:
        """What the function takes at the point: the operand of the assert that building the class reaches."""
        spec = self.asserted[key]
        found = self.asserted_operand(point, key)
        if not found.known:
            why = f"the constructor refuses first: {found.refusal}" if found.refusal else found.why
            raise Unevaluable(f"calls {spec.name}(), whose value only `assert {spec.text}` ({spec.where}) gives, "
                              f"and that assert is not reached with a value: {why}")  # fmt: skip
        self.asserted_used.add(key)
        return found.value

    def asserted_refusal(self, point: Point) -> str | None:
        """The constructor's refusal of the point that an asserted call shows: the assert's operand is None while
        the release indexes the function's value (so it is never None: the assert fails), or a raise or failed
        assert met on the way to it."""
        for key, spec in self.asserted.items():
            found = self.asserted_operand(point, key)
            if found.refusal is not None:
                return found.refusal
            if found.known and found.value is None and (indexed := indexed_call(self.tree, *key)) is not None:
                return (f"`assert {spec.text}` ({spec.where}) fails: {ast.unparse(spec.operand)} is None, and "
                        f"{spec.name}() is a sequence, never None (the release indexes it, {indexed})")  # fmt: skip
        return None

    def _evaluate(self, point: Point) -> bool:
        """workspace_shapes at the point into self.shapes; True when it read an attribute of self that the class's
        __init__ assigns and that is now derived (evaluate again)."""
        # N and K first: deriving them may derive attributes of __init__ the stand-in self then carries.
        n, k = self.n(point), self.k(point)
        interpreter = Interpreter(self.program_for(point), DEFAULT_BUDGET)
        try:
            instance = interpreter.instance(self.cls, self.attributes(point))
            method = interpreter.get_attribute(instance, "workspace_shapes")
            arguments = _call_arguments(method, point.args())
            if "N" in arguments:
                arguments["N"] = n
            if "K" in arguments:
                arguments["K"] = k
            evaluation = _normalize(interpreter.call(method, (), arguments))
            self.shapes[point] = (
                (evaluation.ws13, evaluation.ws2, evaluation.out) if evaluation.ok else evaluation.reason
            )
        except MissingAttribute as error:
            match = MISSING_SELF.search(str(error))
            name = match.group(1) if match else None
            if name is not None and name not in (*self.derived, *self.flags, *self.underivable):
                self.learn(name, point)
                if name in self.derived:
                    return True
            config = MISSING_CONFIG.search(str(error))
            if (
                config is not None
                and config.group(1) != QUANT_CONFIG  # the quant format is a grid axis
                and config.group(1) + "." + config.group(2) not in self.checked_calls
                and len(self.flags) + len(self.call_flags) + len(self.config_flags) < MAX_FLAGS
            ):
                self.checked_calls.add(config.group(1) + "." + config.group(2))  # the tree is read once per name
                where = config_flag(self.tree, self.cls, config.group(1), config.group(2))
                if where is not None:
                    self.config_flags[config.group(1) + "." + config.group(2)] = where  # fmt: skip
            if config is not None and config.group(1) + "." + config.group(2) in self.config_flags:
                flag_name = config.group(1) + "." + config.group(2)
                why = f"; a runtime flag ({self.config_flags[flag_name]}) the point's variant does not set"
            elif name in self.flags:
                flag = self.flags[name]
                why = f"; a runtime flag ({flag.text}, {flag.where}) the point's variant does not set"
            elif name in self.underivable:
                why = f"; not derived: {self.underivable[name]}"
            elif name in self.derived:
                why = f"; not derived at this point: {self.derived[name].text} does not evaluate here"
            else:
                why = ""
            self.shapes[point] = f"workspace_shapes {error}{why}"
        except Unevaluable as error:
            match = UNIMPORTED.search(str(error))
            name = match.group(1) if match else None
            if name is not None and name not in self.checked_calls:
                self.checked_calls.add(name)  # the file is walked once per name, not once per point
                if len(self.flags) + len(self.call_flags) < MAX_FLAGS and zero_argument_calls(
                    self.tree, self.cls, name
                ):
                    self.call_flags[name] = f"{name}() takes no argument and is a condition: a value of the machine"
            why = f"; a runtime flag ({self.call_flags[name]}) the point's variant does not set" if (
                name in self.call_flags) else ""  # fmt: skip
            self.shapes[point] = f"workspace_shapes {error}{why}"
        except RecursionError:
            self.shapes[point] = "workspace_shapes nests deeper than Python's own stack allows"
        return False

    def attributes(self, point: Point) -> dict[str, object]:
        """The stand-in self of the point: point_attributes, the runtime flags its variant sets, and the attributes
        __init__ assigns that were derived (those that do not evaluate at the point are left out). Built once per
        point while self.derived stays the same (learn() forgets them); the caller does not change it (the
        interpreter's Instance copies it)."""
        found = self._attributes.get(point)
        if found is None or found[0] != len(self.derived):
            found = self._attributes[point] = (len(self.derived), self._build_attributes(point))
        return found[1]

    def _build_attributes(self, point: Point) -> dict[str, object]:
        attributes = point_attributes(point)
        for part in filter(None, point.variant.split(",")):
            name, _, value = part.partition("=")
            config, dot, field_name = name.partition(".")
            if dot and isinstance(standin := attributes.get(config), StandIn):  # a property of a config stand-in
                attributes[config] = StandIn(standin.path, **{**standin.attributes, field_name: value == "True"})
            elif not name.endswith("()"):  # a function's value is the program's (program_for)
                attributes[name] = value == "True"
        for name, spec in self.derived.items():
            try:
                attributes[name] = self._derive(spec, point, attributes)
            except (Unevaluable, RecursionError):
                continue
        return attributes

    def _derive(self, spec: InitAttribute, point: Point, attributes: dict[str, object]) -> object:
        """spec's expression as __init__ evaluates it, with the constructor's arguments of the point."""
        interpreter = Interpreter(self.program, DEFAULT_BUDGET)
        instance = interpreter.instance(self.cls, attributes)
        given = {"moe_config": attributes["moe_config"], "quant_config": attributes["quant_config"],
                 "max_num_tokens": point.T, "num_dispatchers": attributes.get("num_dispatchers")}  # fmt: skip
        spec_args = spec.init.args
        positional = [*spec_args.posonlyargs, *spec_args.args][1:]
        with_default = {a.arg for a in positional[len(positional) - len(spec_args.defaults) :]}
        with_default |= {a.arg for a, d in zip(spec_args.kwonlyargs, spec_args.kw_defaults, strict=True) if d}
        names = [a.arg for a in (*positional, *spec_args.kwonlyargs)]
        built = self.built_experts(spec)
        kwargs = {name: given[name] if name in given else
                  interpreter.instance(built[name], attributes) if name in built else Opaque(f"the argument {name}")
                  for name in names if name in given or name in built or name not in with_default}  # fmt: skip
        function = Function(spec.owner.file, spec.init, spec.owner, "method")
        return interpreter.evaluate_in(function, [instance], kwargs, spec.prelude, spec.expression)

    def built_experts(self, spec: InitAttribute) -> dict[str, ParsedClass]:
        """The experts objects a subclass's __init__ builds and hands to spec's __init__ (a delegating class:
        `super().__init__(experts=CutlassExpertsFp8(moe_config, quant_config), ...)`): argument name -> the parsed
        class it constructs from the subclass's own configuration arguments. Each is swept as an instance of that
        class carrying the point's stand-in attributes, as the release builds it from the same configs."""
        built: dict[str, ParsedClass] = {}
        for owner in self.tree.mro(self.cls):
            if owner.key == spec.owner.key:
                break
            binding = self.tree.class_binding(owner, "__init__")
            if binding is None or not isinstance(binding.node, ast.FunctionDef):
                continue
            for construction in constructions(self.tree, owner, binding.node):
                keyword = construction.keyword
                if keyword is not None and keyword not in built and construction.target.key != self.cls.key:
                    built[keyword] = construction.target
        return built

    def learn(self, name: str, point: Point) -> None:
        """Derive self.<name> from the class's __init__ (self.derived), or take it as a runtime flag to sweep both
        values of (self.flags), or say why neither (self.underivable)."""
        if len(self.derived) + len(self.flags) >= MAX_DERIVED:
            self.underivable[name] = f"more than {MAX_DERIVED} attributes of __init__ to derive"
            return
        spec = init_attribute(self.tree, self.cls, name)
        if isinstance(spec, str):
            self.underivable[name] = spec
            return
        try:
            self._derive(spec, point, self.attributes(point))
        except (Unevaluable, RecursionError) as error:
            if spec.runtime() and len(self.flags) < MAX_FLAGS:
                self.flags[name] = spec
            else:
                self.underivable[name] = f"{spec.text}: {error}"
            return
        self.derived[name] = spec

    def variants(self) -> list[str]:
        """The variants the class is swept at: each combination of its runtime flags' values ("" without)."""
        names = [*self.flags, *(f"{name}()" for name in self.call_flags), *self.config_flags]
        return [",".join(f"{name}={value}" for name, value in zip(names, values, strict=True))
                for values in itertools.product((True, False), repeat=len(names))] or [""]  # fmt: skip

    def n(self, point: Point) -> int:
        """The N the release's modular kernel hands this class: its own moe_problem_size on its own weights
        (Marlin's N = I from the packed w2); the harness's N (2I gated, I non-gated) when that does not evaluate."""
        # N is a weight dimension: the same at every D and T (the token counts), so it is derived once per the rest.
        key = point.weights_key()
        if key not in self.n_values:
            size = self._problem_size(key)
            self.n_values[key] = size[0] if isinstance(size, tuple) else size
            self.k_values[key] = size[1] if isinstance(size, tuple) else point.K
        found = self.n_values[key]
        return found if isinstance(found, int) else point.args().N

    def k(self, point: Point) -> int:
        """The K the release's modular kernel hands this class: `K = a1.size(-1)` of its moe_problem_size on the
        input the prepare step gives it (packed two values a byte for a 4-bit activation format the prepare step
        quantizes, see packed_input); the hidden size when that does not evaluate."""
        self.n(point)
        return self.k_values.get(point.weights_key(), point.K)

    def packed_input(self, point: Point) -> bool:
        """Whether apply() gets its hidden states packed two values a byte: the point's activation format is a
        4-bit one (nvfp4, mxfp4) and the class's expects_unquantized_inputs is False, so the modular kernel's
        prepare step quantizes them (`defer_input_quant=self.fused_experts.expects_unquantized_inputs`). False
        when the property does not evaluate (the input as the older releases hand it: unquantized).

        Only for a class whose own workspace_shapes reads expects_unquantized_inputs (sizes by the input's
        quantization, and asserts the packed K against its hidden size); the others keep the unquantized input of
        the grid, as the formats they are swept at include ones their _supports_quant_scheme cannot be evaluated
        to refuse (it asks the platform)."""
        if quant_format(point.quant).act_dtype not in PACKED_DTYPES or not self.sizes_by_input_quant:
            return False
        key = (point.quant, point.variant)
        if key not in self.packed:
            deferred: object = None
            for _ in range(MAX_DERIVED + 1):  # each pass derives one more attribute of __init__ it reads, or ends
                interpreter = Interpreter(self.program_for(point), DEFAULT_BUDGET)
                try:
                    instance = interpreter.instance(self.cls, self.attributes(point))
                    deferred = interpreter.get_attribute(instance, "expects_unquantized_inputs")
                except MissingAttribute as error:
                    match = MISSING_SELF.search(str(error))
                    name = match.group(1) if match else None
                    if name is None or name in (*self.derived, *self.flags, *self.underivable):
                        break
                    self.learn(name, point)
                    if name in self.derived:
                        continue
                except (Unevaluable, RecursionError):
                    pass
                break
            self.packed[key] = deferred is False
        return self.packed[key]

    def n_rule(self) -> str:
        rules = {("N = I" if v == p.I else "N = 2I" if v == 2 * p.I else f"N = {v}") if isinstance(v, int)
                 else f"N = 2I / I (the harness's: {v})" for p, v in self.n_values.items()}  # fmt: skip
        if not rules:
            return "N = w1.size(1)"
        return "; ".join(sorted(rules)) + ("" if self.layout == PLAIN else f" ({self.layout} weight layout)")

    def _problem_size(self, point: Point) -> tuple[int, int] | str:
        """(N, K) of the class's moe_problem_size on its weights and its input (a1q), or why not."""
        interpreter = Interpreter(self.program, DEFAULT_BUDGET)
        w1, w2 = weights(point, self.layout)
        rows = point.args().M if self.format == STANDARD else point.T
        width, dtype = (point.K // 2, DTYPES["uint8"]) if self.packed_input(point) else (point.K, DTYPES["bfloat16"])
        arguments = {"a1": FakeTensor(token_shape(point, self.format, width), dtype), "w1": w1,
                     "w2": w2, "topk_ids": FakeTensor((rows, TOP_K), DTYPES["int64"])}  # fmt: skip
        try:
            method = interpreter.get_attribute(interpreter.instance(self.cls, self.attributes(point)),
                                               "moe_problem_size")  # fmt: skip
            if not isinstance(method, BoundMethod):
                return "moe_problem_size is not a method"
            names = [a.arg for a in method.function.node.args.args[1:]]
            result = interpreter.call(method, (), dict(zip(names, arguments.values(), strict=False)))
        except (Unevaluable, RecursionError) as error:
            return f"moe_problem_size: {error}"
        if isinstance(result, tuple) and len(result) == 5 and isinstance(result[2], int):
            return result[2], result[3] if isinstance(result[3], int) and not isinstance(result[3], bool) else width
        return "moe_problem_size returned no (E, M, N, K, topk)"

    def _static(self, method: str, arguments: tuple) -> bool | None:
        """A staticmethod of the class evaluated to a bool, or None when it does not evaluate."""
        if method in self.exhausted_methods or (self.deadline is not None and self.deadline.spent() is not None):
            return None
        interpreter = Interpreter(self.program, DEFAULT_BUDGET)
        try:
            value = interpreter.get_attribute(interpreter.instance(self.cls, {}), method)
            if not isinstance(value, (Function, BoundMethod)):
                return None
            result = interpreter.call(value, arguments, {})
        except Unevaluable as error:
            if any(limit in str(error) for limit in BUDGET_REASONS):
                self.exhausted_methods.add(method)  # a method that ran out of budget once is not called again
            return None
        except RecursionError:
            self.exhausted_methods.add(method)
            return None
        return result if isinstance(result, bool) else None

    def unsupported(self, point: Point) -> str | None:
        """Why the class says it does not take the point's activation or quantization; None when it does or
        cannot tell."""
        return self.activation_refusal(point.activation) or self.quant_refusal(point.quant)

    def activation_refusal(self, activation: str) -> str | None:
        key = ("activation", activation)
        if key not in self.support:
            reason = None
            if activation.endswith("_no_mul") and self._static("_supports_no_act_and_mul", ()) is False:
                reason = "_supports_no_act_and_mul() is False: no non-gated activations"
            elif self._static("_supports_activation", (Activation(activation),)) is False:
                reason = f"_supports_activation({activation}) is False"
            self.support[key] = reason
        return self.support[key]

    def quant_refusal(self, name: str) -> str | None:
        key = ("quant", name)
        if key not in self.support:
            quant = quant_format(name)
            refused = self._static("_supports_quant_scheme", (quant.weight_key, quant.activation_key)) is False
            self.support[key] = f"_supports_quant_scheme() is False for {name}" if refused else None
        return self.support[key]

    def constructor_refusal(self, point: Point) -> str | None:
        if self.deadline is not None and self.deadline.spent() is not None:
            return None
        if point.quant not in self.constructor:
            attributes = self.attributes(point)
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
        if self.deadline is not None and (spent := self.deadline.spent()) is not None:
            self.failed_trace = ViewTrace(error=spent)
            return self.failed_trace
        trace = trace_apply(self.program_for(point), self.cls, self.attributes(point),
                            apply_arguments(point, ws13, ws2, self.format, self.layout,
                                            packed=self.packed_input(point)))  # fmt: skip
        if trace.error is not None:
            self.failed_trace = trace
        return trace


def sweep_class(tree: SourceTree, cls: ParsedClass, activations: tuple[str, ...], fmt: str = BATCHED,
                deadline: Deadline | None = None, *, trace: bool = True) -> ClassSweep:  # fmt: skip
    """trace=False: apply() is not traced (points are judged on their growth alone), for comparing workspaces."""
    evaluator = _ClassEvaluator(tree, cls, activations, fmt, deadline)
    evaluator.trace = trace
    unset_allowed = init_parameter_default(evaluator.program, cls, "num_dispatchers") is None
    # The formats the class's own _supports_quant_scheme names beyond QUANT_FORMATS, where it takes them; its first
    # gated and non-gated activation it takes (the release's first of each when it takes none).
    quants = tuple(q for q in declared_quant_pairs(tree, cls) if evaluator.quant_refusal(q) is None)
    taken = [q for q in (*(q.name for q in QUANT_FORMATS), *quants) if evaluator.quant_refusal(q) is None]
    evaluator.quant = taken[0] if taken else DEFAULT_QUANT.name
    defaults = default_forms(activations)
    forms = tuple(next((a for a in activations if a.endswith("_no_mul") == plain and
                        evaluator.activation_refusal(a) is None), default)
                  for plain, default in zip((False, True), defaults, strict=False))  # fmt: skip
    outcomes: dict[Point, Outcome] = {}
    live_notes: dict[str, int] = defaultdict(int)
    unused: dict[str, int] = {}  # buffer -> points where apply() is traced and never touches it
    # One evaluation first: the attributes of __init__ it reads are derived, the runtime flags found (swept as
    # variants, each point at each combination of their values).
    probe = Point(1, "set", "E·D", evaluator.quant, forms[0], *GRID_KI[0], BASE_E, BASE_T)
    if evaluator.unsupported(probe) is None:
        evaluator.workspace(probe)
    variants = evaluator.variants()
    if variants != [""]:
        evaluator.shapes.clear()
    points = [dataclasses.replace(p, variant=v) if v else p for p in
              grid(activations, unset_allowed=unset_allowed, quant=evaluator.quant, forms=forms, quants=quants)
              for v in variants]  # fmt: skip
    for point in points:
        outcomes[point] = _judge(evaluator, point, live_notes, unused)
    derived = live_notes.pop("derived", 0)
    if derived and not live_notes:
        live_set = f"derived from apply() views at {derived} points"
    elif derived:
        live_set = f"derived from apply() views at {derived} points; not derived at others: " + "; ".join(live_notes)
    else:
        live_set = "not derived: " + ("; ".join(live_notes) or "no point traced")
        # Growth alone cannot pass a point: without a view of what apply() uses, a workspace that grows like M may
        # still be too small (halved, say).
        outcomes = {p: dataclasses.replace(o, status=NOT_DERIVED, detail=o.detail.split(";")[0] +
                                           "; what apply() uses is not derived") if o.status == CONSISTENT else o
                    for p, o in outcomes.items()}  # fmt: skip
    findings = [_unused_finding(tree, cls, buffer, count) for buffer, count in unused.items()]
    # The functions that took a value an __init__ asserts, named in every point's variant with the assert's line.
    parts = [spec.part for key, spec in evaluator.asserted.items() if key in evaluator.asserted_used]
    if parts:
        outcomes = {dataclasses.replace(p, variant=",".join(filter(None, (p.variant, *parts)))): o
                    for p, o in outcomes.items()}  # fmt: skip
    return ClassSweep(
        name=cls.name,
        file=cls.file.removeprefix("vllm/"),
        outcomes=outcomes,
        live_set=live_set,
        format=fmt,
        n_rule=evaluator.n_rule(),
        findings=[f for f in findings if f is not None],
    )


def _judge(evaluator: _ClassEvaluator, point: Point, live_notes: dict[str, int], unused: dict[str, int]) -> Outcome:
    why = evaluator.unsupported(point)
    if why is not None:
        return Outcome(UNSUPPORTED, why)
    refusal = evaluator.asserted_refusal(point)
    if refusal is not None:
        return Outcome(REFUSED, f"the constructor refuses {point.quant}: {refusal}")
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
    n = evaluator.n(point)
    known = dict(total_bytes=total, shapes=(tuple(ws13), tuple(ws2), tuple(out)), N=n)
    growth = _d_growth(evaluator, point, shapes)
    if isinstance(growth, Outcome):
        return dataclasses.replace(growth, **known)
    double = [name for name, g in growth.items() if point.D > 1 and g == point.D**2 and name != "out"]
    if double:
        return Outcome(DOUBLE, f"token dim of {'/'.join(double)} is M·D: D counted twice", **known)
    # The output contract: apply() writes (E, M, K) in the batched format, (M, K) in the standard one.
    rows = math.prod(token_shape(point, evaluator.format, point.K))
    if 0 < math.prod(out) < rows:
        return Outcome(UNDER, f"out holds x{math.prod(out) / rows:.3g} of the {evaluator.format} format's "
                              f"{'(E, M, K)' if evaluator.format == BATCHED else '(M, K)'}",
                       ratio=math.prod(out) / rows, **known)  # fmt: skip
    stuck = _stuck_with_d(evaluator, point, growth)
    if stuck:
        return Outcome(UNDER, f"{'/'.join(stuck)} does not grow with D while the output grows xD", **known)
    under = _harness_live_set(evaluator, point, total)
    if under is not None:
        return dataclasses.replace(under, **known)
    if not evaluator.trace or not traces_live_set(point, evaluator.quant):
        # apply()'s refusals depend on the activation, the quantization and the shapes, not on D, E or T: a point
        # off the traced sub-grid takes that of its traced sibling at D = 1, E and T at the base.
        sibling = evaluator.refusals.get(dataclasses.replace(point, D=LIVE_D[0], E=BASE_E, T=BASE_T))
        if sibling is not None:
            return Outcome(REFUSED, f"apply() refuses (as at D = {LIVE_D[0]}, E = {BASE_E}, T = {BASE_T}): {sibling}",
                           **known)  # fmt: skip
        return Outcome(CONSISTENT, "token dim is M = T·D", **known)
    trace = evaluator.live(point, ws13, ws2)
    evaluator.refusals[point] = trace.refusal
    if trace.refusal is not None:
        return Outcome(REFUSED, f"apply() refuses: {trace.refusal}", **known)
    needs = {name: trace.need_bytes(name) for name in ("workspace13", "workspace2")}
    known["uses"] = (needs["workspace13"], needs["workspace2"])
    allocated = {"workspace13": math.prod(ws13) * w, "workspace2": math.prod(ws2) * w}
    for name, need in needs.items():
        if need is None:
            live_notes[trace.why_not_derived(name).split(" (", 1)[0]] += 1
        elif need > allocated[name]:
            return Outcome(UNDER, f"apply() views {name} to x{need / allocated[name]:.3g} of its size",
                           ratio=allocated[name] / need, **known)  # fmt: skip
    if None in needs.values():
        return Outcome(NOT_DERIVED, "token dim is M = T·D; what apply() uses is not derived", **known)
    live_notes["derived"] += 1
    for name, need in needs.items():
        # What the untouched buffer costs: all of workspace2; of workspace13 what it adds to the common buffer
        # beyond the output, which shares it.
        cost = allocated[name] if name == "workspace2" else common - math.prod(out) * w
        if need == 0 and cost > 0 and not any(v.buffer == name for v in trace.views):
            unused[name] = unused.get(name, 0) + 1
    needed = max(needs["workspace13"], math.prod(out) * w) + needs["workspace2"]
    if needed and total > needed:
        ratio = total / needed
        return Outcome(OVER, f"x{ratio:.3g} of what apply() views", ratio=ratio, **known)
    return Outcome(CONSISTENT, "token dim is M = T·D; sized to apply()'s views", **known)


def _d_growth(evaluator: _ClassEvaluator, point: Point, shapes) -> dict[str, float] | Outcome:
    """prod(buffer) at the point over prod(buffer) at D = 1, per buffer (ws13, ws2, out); an Outcome when that
    cannot be had."""
    reference = point.reference()
    base = evaluator.workspace(reference) if reference != point else shapes
    if isinstance(base, str):
        return Outcome(UNEVALUATED, f"not evaluated at D = 1 to compare: {base}")
    growth: dict[str, float] = {}
    for index, (name, before, after) in enumerate(zip(("ws13", "ws2", "out"), base, shapes, strict=False)):
        b, a = math.prod(before), math.prod(after)
        if b == 0 or a == 0:
            continue
        growth[name] = a / b
        if point.dispatchers == "set" and growth[name] not in (1, point.D, point.D**2):
            # A size affine in the tokens, rounded up (a padding per expert, DeepGEMM's aligned M): what the buffer
            # holds for T·D (or T·D²) tokens at D = 1 tells which token count it is sized by.
            tokens = next((f for f in (point.D, point.D**2) if _buffer_at(evaluator, point, f, index) == a), None)
            if tokens is None:
                return Outcome(UNEVALUATED, f"{name} grows x{growth[name]:g} from D = 1 to D = {point.D}")
            growth[name] = tokens
    return growth


def _buffer_at(evaluator: _ClassEvaluator, point: Point, factor: int, index: int) -> int | None:
    """prod(buffer `index`) at D = 1 with T·factor tokens per rank; None when that does not evaluate."""
    shapes = evaluator.workspace(dataclasses.replace(point.reference(), T=point.T * factor))
    return None if isinstance(shapes, str) else math.prod(shapes[index])


def _stuck_with_d(evaluator: _ClassEvaluator, point: Point, growth: dict[str, float]) -> list[str]:
    """The growth check: the workspaces that stay x1 from D = 1 to D while the output grows xD, and that do grow
    with T (so they hold tokens: sized with T where M = T·D was due). Empty at D = 1 and without dispatchers set."""
    if point.D == 1 or point.dispatchers != "set" or growth.get("out") != point.D:
        return []
    stuck = [name for name in ("ws13", "ws2") if growth.get(name) == 1]
    if not stuck:
        return []
    doubled = dataclasses.replace(point, T=2 * point.T)
    here, there = evaluator.workspace(point), evaluator.workspace(doubled)
    if isinstance(here, str) or isinstance(there, str):
        return []
    index = {"ws13": 0, "ws2": 1}
    grows = [name for name in stuck if math.prod(there[index[name]]) > math.prod(here[index[name]])]
    # ... and that hold less than the same M = T·D tokens get at D = 1 (a size rounded up to a padding may stay
    # x1 from D = 1 to D and still be what M tokens need)
    return [name for name in grows
            if (same := _buffer_at(evaluator, point, point.D, index[name])) is None
            or math.prod(here[index[name]]) < same]  # fmt: skip


def _unused_finding(tree: SourceTree, cls: ParsedClass, buffer: str, points: int) -> Finding | None:
    """The buffer apply() never touches, with the line of workspace_shapes that sizes it."""
    found = tree.find_method(cls, "workspace_shapes")
    if found is None:
        return None
    owner, method = found
    line = _allocation_line(method, 0 if buffer == "workspace13" else 1)
    return Finding("unused-buffer", buffer, owner.file.removeprefix("vllm/"), line,
                   f"{cls.name} allocates {buffer} and its apply() never views it, nor hands it on "
                   f"({points} traced points)")  # fmt: skip


def _allocation_line(method: ast.FunctionDef, index: int) -> int:
    """The line that builds element `index` of workspace_shapes' returned tuple: its last assignment when the
    element is a name, else the return itself."""
    returns = [n for n in ast.walk(method) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)]
    if not returns:
        return method.lineno
    node = returns[-1]
    element = node.value.elts[index] if len(node.value.elts) > index else None  # type: ignore[union-attr]
    if isinstance(element, ast.Name):
        assigned = [n.lineno for n in ast.walk(method) if isinstance(n, (ast.Assign, ast.AnnAssign))
                    and any(isinstance(t, ast.Name) and t.id == element.id
                            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]  # fmt: skip
        if assigned:
            return (
                max(line for line in assigned if line <= node.lineno)
                if any(line <= node.lineno for line in assigned)
                else assigned[0]
            )
    return element.lineno if element is not None else node.lineno


def buffer_bytes(tree: SourceTree, swept: ClassSweep, buffer: str, args: SizingArgs) -> int | None:
    """What a buffer of a swept class costs at one sizing (a reference deployment's T, D, E, K, I): all of
    workspace2, or what workspace13 adds to the common buffer beyond the output; None when it does not evaluate."""
    cls = next((c for c in tree.class_named(swept.name) if c.file.removeprefix("vllm/") == swept.file), None)
    if cls is None:
        return None
    point = Point(args.num_dispatchers, "set", "E·D", DEFAULT_QUANT.name, args.activation, args.hidden_size,
                  args.intermediate_size, args.num_local_experts, args.max_tokens_per_rank)  # fmt: skip
    evaluator = _ClassEvaluator(tree, cls, (args.activation,), swept.format)
    shapes = evaluator.workspace(point)
    if isinstance(shapes, str):
        return None
    ws13, ws2, out = (math.prod(s) * args.dtype_bytes for s in shapes)
    return ws2 if buffer == "workspace2" else max(ws13, out) - out


def problem_n(
    tree: SourceTree, cls: ParsedClass, args: SizingArgs, fmt: str, quant: str
) -> tuple[int, str] | str | None:
    """The N the release's modular kernel hands a class whose moe_problem_size derives it from Marlin's packed
    weights, at one sizing (K, I, E, T, D, activation) and quant format (the weights' bits): (N, its rule) as the
    sweep derives it (Marlin: N = I from w2's packed rows), the reason where it does not evaluate; None for a class
    of the plain layout, whose N is the harness's (2I gated, I non-gated)."""
    if _weight_layout(tree, cls) != MARLIN:
        return None
    point = Point(args.num_dispatchers, "set", "E·D", quant, args.activation, args.hidden_size,
                  args.intermediate_size, args.num_local_experts, args.max_tokens_per_rank)  # fmt: skip
    evaluator = _ClassEvaluator(tree, cls, (args.activation,), fmt)
    evaluator.n(point)
    found = evaluator.n_values[point.weights_key()]
    return (found, evaluator.n_rule()) if isinstance(found, int) else found


def _weight_layout(tree: SourceTree, cls: ParsedClass) -> str:
    """marlin when the class's moe_problem_size derives N from Marlin's packed weights, else plain."""
    found = tree.find_method(cls, "moe_problem_size")
    if found is not None:
        for node in ast.walk(found[1]):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name == "marlin_moe_intermediate_size":
                return MARLIN
    return PLAIN


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
    limits: list[str] = dataclasses.field(default_factory=list)  # caps and budgets hit, one line each
    # the classes `--classes` named and how many the tree has; None: every class was swept
    selected: tuple[tuple[str, ...], int] | None = None

    @property
    def failed(self) -> list[ClassSweep]:
        return [c for c in self.classes if c.failed]

    @property
    def findings(self) -> list[tuple[ClassSweep, Finding]]:
        return [(c, f) for c in self.classes for f in c.findings]


@dataclass(frozen=True)
class SweepBudget:
    """The bounds of one whole sweep (each evaluation has its own interpreter.Budget besides). The defaults keep a
    hostile tree's sweep within about a minute of CPU; `--budget-s` raises cpu_s for a tree one trusts."""

    # CPU seconds for the whole sweep. 0.33.0's 46 classes take about 18 on a shared 2-core machine, and a budget
    # that a real release's sweep can exhaust on a slower or busier runner fails a pull request's job for nothing:
    # the bound is held against hostile trees, with room for a release of twice today's fused_moe.
    cpu_s: float = 60.0
    class_share: float = 0.35  # the most of cpu_s one class may take, so one hostile class leaves the others theirs
    rss_bytes: int = 3 << 30  # what the process's peak resident memory may grow by during the sweep
    max_classes: int = 256  # 0.33.0 has 46
    max_activations: int = 32  # 0.33.0's MoEActivation has 11 members


# Wall-clock seconds between two readings of the CPU clock and the peak memory (each a system call; a sweep asks
# about a hundred thousand times). One thread's CPU time grows no faster than the wall clock, so a budget is seen
# spent at most this much CPU late.
CHECK_EVERY_S = 0.005


class Deadline:
    """CPU time and peak memory against a SweepBudget: `spent()` is None while within it, else why not (and stays
    so: what ran out of budget is not tried again). The clocks are read at most every CHECK_EVERY_S."""

    def __init__(self, budget: SweepBudget, *, what: str = "sweep", start: float | None = None) -> None:
        self.budget, self.what = budget, what
        self.start = time.process_time() if start is None else start
        self.start_rss = _peak_rss()  # the budget bounds what the peak grows by during this sweep
        self.hit: str | None = None
        self.next_check = 0.0  # time.monotonic() (no system call) before which the clocks are not read again

    def spent(self) -> str | None:
        if self.hit is None and (now := time.monotonic()) >= self.next_check:
            self.next_check = now + CHECK_EVERY_S
            used = time.process_time() - self.start
            if used > self.budget.cpu_s:
                self.hit = (f"the {self.what}'s time budget of {self.budget.cpu_s:g} s of CPU ran out "
                            "(--budget-s raises it for a tree you trust)")  # fmt: skip
            elif _peak_rss() - self.start_rss > self.budget.rss_bytes:
                self.hit = (f"the {self.what}'s memory budget of {self.budget.rss_bytes >> 20} MiB more peak "
                            "resident memory ran out")  # fmt: skip
        return self.hit

    def share(self, share: float) -> Deadline:
        """A deadline for one part: share of the whole, never past the whole's own end."""
        return _Nested(Deadline(dataclasses.replace(self.budget, cpu_s=self.budget.cpu_s * share), what=self.what),
                       self)  # fmt: skip


class _Nested(Deadline):
    def __init__(self, part: Deadline, whole: Deadline) -> None:
        super().__init__(part.budget, what=part.what, start=part.start)
        self.whole = whole

    def spent(self) -> str | None:
        whole = self.whole.spent()
        if whole is not None:
            return whole
        return super().spent()


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def sweep(tree: SourceTree, *, class_filter: Callable[[str], bool] | None = None,
          budget: SweepBudget | None = None, formats: tuple[str, ...] = (BATCHED, STANDARD),
          trace: bool = True) -> SweepResult:  # fmt: skip
    """Every experts class that sizes a workspace (batched and standard format) over the grid, within budget."""
    budget = budget or SweepBudget()
    deadline = Deadline(budget)
    limits: list[str] = []
    activations = activations_of(tree)
    if len(activations) > budget.max_activations:
        limits.append(f"MoEActivation has {len(activations)} members: the first {budget.max_activations} are swept "
                      f"(the cap on activations)")  # fmt: skip
        activations = activations[: budget.max_activations]
    found = [(c, BATCHED) for c in tree.batched_classes()] if BATCHED in formats else []
    found += [(c, STANDARD) for c in tree.standard_classes()] if STANDARD in formats else []
    found = [(c, f) for c, f in found if class_filter is None or class_filter(c.name)]
    if len(found) > budget.max_classes:
        limits.append(f"{len(found)} experts classes: the first {budget.max_classes} are swept (the cap on classes); "
                      f"not swept: {', '.join(c.name for c, _ in found[budget.max_classes:][:5])}"
                      + (" ..." if len(found) > budget.max_classes + 5 else ""))  # fmt: skip
        found = found[: budget.max_classes]
    unparsed = {f: why for f, why in sorted(tree.unparsed.items()) if tree.may_define_batched_classes(f)}
    classes = []
    for cls, fmt in found:
        classes.append(sweep_class(tree, cls, activations, fmt, deadline.share(budget.class_share), trace=trace))
    if deadline.hit is not None:
        cut = [c.name for c in classes if any(deadline.hit in o.detail for o in c.outcomes.values())]
        limits.append(f"{deadline.hit}; points not evaluated in {len(cut)} classes: {', '.join(cut[:5])}"
                      + (" ..." if len(cut) > 5 else ""))  # fmt: skip
    else:
        short = [c.name for c in classes if any("s of CPU ran out" in o.detail for o in c.outcomes.values())]
        if short:
            limits.append(
                f"{len(short)} classes ran out of their share ({budget.class_share:g}) of the sweep's time "
                f"budget of {budget.cpu_s:g} s: {', '.join(short[:5])}" + (" ..." if len(short) > 5 else "")
            )
    return SweepResult(
        label=tree.source.label, version=tree.source.version, origin=tree.source.origin, activations=activations,
        classes=classes, unparsed=unparsed, limits=limits,
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
