"""Checkpoint formats: what one linear (or one FusedMoE's stacked experts) allocates on the GPU, tensor by tensor,
as vLLM's quantization methods create them (`create_weights`) and keep them after `process_weights_after_loading`.

    fp8 with a block [bo, bi] (fp8.py): the (out, in) weight in 1 B, weight_scale_inv (ceil(out/bo), ceil(in/bi)) f32
    fp8 per tensor (fp8.py, modelopt.py, online `--quantization fp8`): 1 B, one f32 scale (the logical shards'
        max, w8a8_utils.requantize_with_max_scale), ModelOpt's static input scale
    fp8 / int8 per channel (compressed-tensors W8A8, fbgemm_fp8): 1 B, weight_scale (out, 1) f32 (+ fbgemm's
        input_scale_ub)
    WNA16 pack-quantized (compressed-tensors W4A16/W8A16): weight_packed (out, in x bits / 32) int32,
        weight_scale (out, in / g) in the activation dtype, zero points (out x bits / 32, in / g) int32 when
        asymmetric, weight_shape (2,) int64
    AWQ (awq.py, awq_marlin.py): qweight (in, out x bits / 32) int32, scales (in / g, out), qzeros
        (in / g, out x bits / 32) int32; under Machete (the mixed-precision kernel choice on compute capability 9.0,
        release_defaults.awq_mixed_precision_kernel) the zero points, scales pre-applied, (in / g, out) in the
        activation dtype
    GPTQ (gptq.py, gptq_marlin.py): qweight (in x bits / 32, out) int32, scales (in / g, out), qzeros as AWQ's,
        g_idx (in,) int32
    NVFP4 (modelopt_fp4, compressed-tensors nvfp4-pack-quantized): (out, in / 2) uint8, weight_scale (out, in / 16)
        fp8, one global f32 scale and one input scale
    ModelOpt (FP8, NVFP4) also builds the lm_head in its format unless excluded, and a flat config.json form lists
        the excluded modules under a key the release names (release_defaults.modelopt_reads: `ignore` in 0.26.0);
        a release that lists GPTQ's quantized layers from the checkpoint's safetensors builds every linear outside
        FusedMoE unquantized from a directory without them (release_defaults.gptq_layers_from_checkpoint)
    MXFP4 (mxfp4.py, experts only): (E, N, K / 2) uint8 swizzled, scales (E, N, K / 32) uint8 (e8m0) twice: the
        Triton backend's swizzled copy beside the loaded one, which it keeps in 0.19.0 (it deletes only the loaded
        weights) and deletes in 0.26.0 (release_defaults.mxfp4_keeps_loaded_scales reads which); biases f32 after
        its conversion

Marlin (awq_marlin, gptq_marlin and compressed-tensors WNA16 with act order, their MoE layers, NVFP4 without FP4
tensor cores) repacks the weight into a tensor of the same bytes and adds a workspace per linear:
`marlin_make_workspace_new`, one int32 per SM (x 4 for the MoE kernel), quantization/utils/marlin_utils.py. GPTQ and
WNA16 linears without act order run Machete on Hopper: the weight prepacked in place, every other tensor kept as
loaded (GPTQ's qzeros and g_idx too), no workspace (RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16's published
0.19.0 log: "Using MacheteLinearKernel for GPTQMarlinLinearMethod", 5.38 GiB). The bytes per weight are exact for the
layouts above, the Triton MXFP4 backend's swizzled ones with triton_kernels' Hopper padding: gpt-oss-20b at TP 2 logs
7.01 GiB in vLLM 0.19.0 (llm-d-planner's run), where they give 7.02; openai/gpt-oss-120b on an H100 logs 64.38 GiB in
0.14.1 (vLLM issue #33155), as they give with that release's 16 x 32 value padding.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from harness.core.units import round_up

FP8_SCALE = 4  # f32
INT32 = 4


@dataclass(frozen=True)
class Quant:
    """One checkpoint format: how its quantized linears are laid out, and which modules it leaves unquantized."""

    method: str  # quantization_config.quant_method as vLLM names it (fp8, compressed-tensors, awq, ...)
    scheme: str  # fp8-block, fp8-tensor, fp8-channel, int8-channel, int8-tensor, wna16, awq, gptq, nvfp4, mxfp4
    bits: int = 8
    group_size: int = 0  # WNA16/AWQ/GPTQ: the group; 0 per channel (the whole input row)
    symmetric: bool = True
    block: tuple[int, int] | None = None
    act_order: bool = False  # GPTQ desc_act / compressed-tensors actorder "group": g_idx kept
    marlin: bool = False  # repacked for the Marlin kernel (+ a workspace per linear)
    experts_only: bool = False  # MXFP4 in gpt-oss: only FusedMoE layers are quantized
    ignore: tuple[str, ...] = ()  # module-name patterns left unquantized (ignore, modules_to_not_convert, ...)
    # ModelOpt: the patterns under each key a flat config.json quantization_config holds ("ignore",
    # "exclude_modules"); the release's from_config picks one (release_defaults.modelopt_reads), and the nested
    # hf_quant_config form ({"quantization": {...}}) reads its "exclude_modules" (then in `ignore`, nested=True)
    ignore_by_key: tuple[tuple[str, tuple[str, ...]], ...] = ()
    nested: bool = False
    lm_head: bool = False  # ParallelLMHead built with this format (ModelOpt's get_quant_method), unless ignored
    # GPTQ: the linears outside FusedMoE are quantized (False: the release lists the quantized layers from the
    # checkpoint's safetensors and a directory without them lists none: release_defaults.gptq_layers_from_checkpoint)
    dense_linears: bool = True
    layers_listed: bool = False  # GPTQ: modules_in_block_to_quantize given in the config
    # AWQ: the linears run Machete (the release's mixed-precision kernel choice on compute capability 9.0): the zero
    # points become an (in / group, out) tensor in the activation dtype, no Marlin workspace
    machete: bool = False
    online: bool = False  # `--quantization fp8` of an unquantized checkpoint
    static_input: bool = False  # a static input scale per linear (ModelOpt FP8, static compressed-tensors)
    # MXFP4's swizzled values on Hopper: rows x bytes padded to these (triton_kernels' HopperMXValueLayout)
    swizzle_align: tuple[int, int] = (64, 64)
    # MXFP4's scale groups padded to this multiple before the Hopper scale layout (0.26.0 on 9.0: 4)
    scale_groups_multiple: int = 1
    loaded_scales_kept: bool = True  # MXFP4: the loaded block scales kept beside the swizzled copy (until 0.26.0)
    source: str = ""

    @property
    def label(self) -> str:
        detail = {
            "fp8-block": f"fp8 + f32 scales per {self.block[0]}x{self.block[1]} block" if self.block else "fp8",
            "fp8-tensor": "fp8 + a per-tensor f32 scale" + (" (online --quantization fp8)" if self.online else ""),
            "fp8-channel": "fp8 + per-channel f32 scales",
            "int8-channel": "int8 + per-channel f32 scales",
            "int8-tensor": "int8 + a per-tensor f32 scale",
            "wna16": f"int{self.bits} packed in int32, group {self.group_size or 'channel'}"
            + ("" if self.symmetric else " + zero points")
            + self._kernel,
            "awq": f"AWQ int{self.bits} group {self.group_size} + zero points" + (" (Marlin)" if self.marlin else ""),
            "gptq": f"GPTQ int{self.bits} group {self.group_size}"
            + (" desc_act" if self.act_order else "")
            + self._kernel,
            "nvfp4": "NVFP4: fp4 pairs + fp8 scales per 16" + (" (Marlin)" if self.marlin else ""),
            "mxfp4": "MXFP4 experts: fp4 pairs + e8m0 scales per 32",
        }
        return f"{self.method} {detail.get(self.scheme, self.scheme)}"

    @property
    def _kernel(self) -> str:
        if not self.marlin:
            return ""
        return " (Marlin)" if self.act_order else " (Machete linears, Marlin MoE)"

    def quantizes(self, module: str, *, expert: bool = False) -> bool:
        """Whether vLLM builds `module` (e.g. model.layers.0.self_attn.qkv_proj) with this quantization."""
        if (self.experts_only or not self.dense_linears) and not expert:
            return False
        return not any(_matches(pattern, module) for pattern in self.ignore)


def _matches(pattern: str, module: str) -> bool:
    """compressed-tensors `re:` patterns, fnmatch-like `*` patterns (modules_to_not_convert, exclude_modules) and
    plain names, which match the module or any module under it (vLLM's is_layer_skipped: prefix / substring)."""
    if pattern.startswith("re:"):
        try:
            return re.fullmatch(pattern[3:], module) is not None or re.match(pattern[3:], module) is not None
        except re.error:
            return False
    if "*" in pattern:
        regex = "^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "($|\\.)"
        return re.match(regex, module) is not None
    return f".{pattern}." in f".{module}."


def linear_tensors(q: Quant | None, out_f: int, in_f: int, act_bytes: int, *, stacked: int = 1, shards: int = 1,
                   quantized: bool = True) -> list[int]:  # fmt: skip
    """The bytes of each tensor one linear allocates (weight and its scales, zero points, indices), `stacked`
    experts sharing each tensor as FusedMoE's w13 / w2 do. `shards`: the logical matrices a merged linear holds
    (QKV 3, gate_up 2), each with its own per-tensor scale."""
    E = stacked
    if q is None or not quantized:
        return [E * out_f * in_f * act_bytes]
    s = q.scheme
    if s == "fp8-block":
        bo, bi = q.block or (128, 128)
        return [E * out_f * in_f, E * math.ceil(out_f / bo) * math.ceil(in_f / bi) * FP8_SCALE]
    if s == "fp8-tensor":  # the shards' scales are requantized to their max (w8a8_utils.requantize_with_max_scale)
        return [E * out_f * in_f, E * FP8_SCALE] + ([E * FP8_SCALE] if q.static_input else [])
    if s in ("fp8-channel", "int8-channel"):
        return [E * out_f * in_f, E * out_f * FP8_SCALE] + ([E * FP8_SCALE] if q.static_input else [])
    if s == "int8-tensor":
        return [E * out_f * in_f, E * FP8_SCALE] + ([E * FP8_SCALE] if q.static_input else [])
    if s == "mxfp4":  # the Triton backend swizzles weight and scales, then deletes the loaded weight only
        groups = math.ceil(in_f / 32)
        # triton_kernels' Hopper layouts pad the swizzled copies: values to swizzle_align (the HopperMXValueLayout
        # vLLM vendors, third_party/triton_kernels: 64 rows x 64 bytes in 0.19.0, 16 x 32 from 0.22.0, read per
        # release by release_defaults.mxfp4_hopper_padding), scales to 256 rows (2 x 8 warps x 2 x 8) x 2 columns
        # (HopperMXScaleLayout), their groups first to scale_groups_multiple
        rows, width = q.swizzle_align
        values = E * round_up(out_f, rows) * round_up(in_f // 2, width)
        swizzled_scales = E * round_up(out_f, 256) * round_up(round_up(groups, q.scale_groups_multiple), 2)
        return [values, *([E * out_f * groups] if q.loaded_scales_kept else []), swizzled_scales]
    if s == "nvfp4":
        # weight, its fp8 scales per 16, and the global weight and input scales (the shards' max: one each)
        tensors = [E * out_f * in_f // 2, E * out_f * math.ceil(in_f / 16), E * 4, E * 4]
        return tensors + ([_marlin_workspace(False)] if q.marlin and stacked == 1 else [])
    groups = math.ceil(in_f / q.group_size) if q.group_size > 0 else 1
    packed = E * out_f * in_f * q.bits // 8
    scales = E * groups * out_f * act_bytes
    zeros = E * groups * math.ceil(out_f * q.bits / 32) * INT32
    tensors = [packed, scales]
    # On Hopper a linear without act order runs Machete (MacheteLinearKernel, first of choose_mp_linear_kernel's
    # kernels at compute capability 9.0): it prepacks the weight in place and keeps every other tensor as loaded,
    # with no workspace. With act order, and for MoE layers, Marlin.
    machete = stacked == 1 and q.marlin and not q.act_order and (s in ("wna16", "gptq") or (s == "awq" and q.machete))
    if s == "wna16":
        if not q.symmetric:
            tensors.append(zeros)
        if q.act_order:
            tensors += [E * in_f * INT32] * (2 if q.marlin else 1)
        tensors.append(16 if E == 1 else E * 2 * act_bytes)  # weight_shape: (2,) int64; (E, 2) in the act dtype
    elif s == "awq":  # under Machete the zero points, scales pre-applied, in the activation dtype (machete.py)
        tensors.append(groups * out_f * act_bytes if machete else zeros)
    elif s == "gptq":
        if machete or not (q.marlin and q.symmetric):
            tensors.append(zeros)
        if machete:
            tensors.append(in_f * INT32)  # g_idx, kept as loaded
        elif q.act_order or not q.marlin:
            tensors += [E * in_f * INT32] * (2 if q.marlin else 1)  # g_idx (+ its sort indices under Marlin)
    if q.marlin and stacked == 1 and not machete:  # the MoE kernel's one workspace per layer: marlin_workspace()
        tensors.append(_marlin_workspace(False))
    return tensors


SMS = 132  # H100 SXM / H200; the Marlin workspace is one int32 per SM (marlin_utils.marlin_make_workspace_new)


def _marlin_workspace(moe: bool) -> int:
    return SMS * (4 if moe else 1) * INT32


def marlin_moe_workspace(q: Quant | None) -> list[int]:
    """The Marlin MoE kernel's workspace, one per FusedMoE layer (marlin_make_workspace_new(device, 4))."""
    return [_marlin_workspace(True)] if q is not None and q.marlin else []


# vllm serve --quantization values whose checkpoint formats are sized here (fp8 also quantizes an unquantized one)
QUANTIZATION_CHOICES = ("fp8", "fbgemm_fp8", "mxfp4", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors",
                        "modelopt", "modelopt_fp4")  # fmt: skip


class QuantConfigError(ValueError):
    """A quantization_config vLLM cannot read, in one line."""


# What each format accepts as the activation dtype (the quantization config's get_supported_act_dtypes; vLLM
# refuses any other --dtype: config/vllm.py _get_quantization_config "... is not supported for quantization
# method ...").
SUPPORTED_ACT_DTYPES: dict[str, tuple[str, ...]] = {
    "fp8": ("bfloat16", "float16"),
    "fbgemm_fp8": ("bfloat16", "float16"),
    "modelopt": ("bfloat16", "float16"),
    "modelopt_fp4": ("bfloat16", "float16"),
    "mxfp4": ("bfloat16",),
    "compressed-tensors": ("float32", "float16", "bfloat16"),
    "awq": ("float16",),
    "awq_marlin": ("float16", "bfloat16"),
    "gptq": ("float16",),
    "gptq_marlin": ("float16", "bfloat16"),
}


def _shown(value: object) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_field(config: dict, key: str, default: int, where: str, allowed: tuple[int, ...] | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        value = default
    if type(value) is not int or (allowed is not None and value not in allowed):
        raise QuantConfigError(f"{where}.{key} = {_shown(value)}; vLLM accepts "
                               + (", ".join(map(str, allowed)) if allowed else "an integer"))  # fmt: skip
    return value


MAX_PATTERNS = 256  # a checkpoint's ignore list names a few modules (or a regex each); more is not read
MAX_PATTERN_CHARS = 200
MAX_REGEX_REPEATS = 4


def _patterns(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuantConfigError(f"{where} = {_shown(value)} is not a list of module names")
    if len(value) > MAX_PATTERNS or any(len(v) > MAX_PATTERN_CHARS for v in value):
        raise QuantConfigError(f"{where}: {len(value)} patterns; at most {MAX_PATTERNS} of at most "
                               f"{MAX_PATTERN_CHARS} characters are read")  # fmt: skip
    for pattern in value:
        if pattern.startswith("re:") and not _regex_is_bounded(pattern[3:]):
            raise QuantConfigError(f"{where}: pattern {_shown(pattern)} is not a regex matched in bounded time "
                                   f"(invalid, a back-reference, a repeat inside a repeat, or over "
                                   f"{MAX_REGEX_REPEATS} unbounded repeats)")  # fmt: skip
    return tuple(value)


def _regex_is_bounded(pattern: str) -> bool:
    """Whether `pattern` compiles and cannot backtrack exponentially on a module name: no back-references, no
    unbounded repeat nested in another, at most MAX_REGEX_REPEATS unbounded repeats (vLLM matches compressed-tensors'
    `re:` patterns with re.match; the plan must not hang on a hostile one)."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    try:
        tree = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    repeats = 0

    def walk(items, inside: bool) -> bool:
        nonlocal repeats
        for op, av in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)):
                _low, high, sub = av
                unbounded = high is c.MAXREPEAT or high > 1
                if unbounded:
                    if inside:
                        return False
                    repeats += 1
                if not walk(sub, inside or unbounded):
                    return False
            elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return False
            elif op == c.SUBPATTERN:
                if not walk(av[-1], inside):
                    return False
            elif op == c.BRANCH:
                if not all(walk(branch, inside) for branch in av[1]):
                    return False
            elif (op in (c.ASSERT, c.ASSERT_NOT) and not walk(av[-1], inside)) or (
                    op == getattr(c, "ATOMIC_GROUP", None) and not walk(av, inside)):  # fmt: skip
                return False
        return True

    return walk(tree, False) and repeats <= MAX_REGEX_REPEATS


def parse_quant(config: object, *, where: str = "quantization_config") -> Quant:
    """The Quant of a config.json's quantization_config (a JSON object), as vLLM reads it."""
    if not isinstance(config, dict):
        raise QuantConfigError(f"{where} = {_shown(config)} is not a JSON object; vLLM reads "
                               f"{where}.quant_method from one")  # fmt: skip
    method = config.get("quant_method")
    if not isinstance(method, str) or not method:
        raise QuantConfigError(f"{where}.quant_method = {_shown(method)}; vLLM accepts one of: "
                               + ", ".join(sorted(SUPPORTED_ACT_DTYPES)))  # fmt: skip
    method = method.lower()
    if method == "fp8":
        block = config.get("weight_block_size")
        if block is not None:
            if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
                raise QuantConfigError(f"{where}.weight_block_size = {_shown(block)}; vLLM accepts two positive "
                                       "integers [block_n, block_k]")  # fmt: skip
            return Quant("fp8", "fp8-block", block=(block[0], block[1]), ignore=_ignored(config, where),
                         source="layers/quantization/fp8.py Fp8LinearMethod / Fp8MoEMethod: fp8 weight + "
                         "weight_scale_inv per block")  # fmt: skip
        return Quant(
            "fp8",
            "fp8-tensor",
            ignore=_ignored(config, where),
            source="layers/quantization/fp8.py: fp8 weight + one f32 weight_scale per logical shard",
        )
    if method == "fbgemm_fp8":
        return Quant("fbgemm_fp8", "fp8-channel", ignore=_patterns(config.get("modules_to_not_convert"), where),
                     static_input=True,
                     source="layers/quantization/fbgemm_fp8.py: fp8 weight + (out, 1) f32 weight_scale + the f32 "
                     "input_scale_ub")  # fmt: skip
    if method == "mxfp4":
        return Quant("mxfp4", "mxfp4", bits=4, group_size=32, experts_only=True,
                     ignore=_patterns(config.get("modules_to_not_convert"), where),
                     source="layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights: w13 (E, 2I, K/2) u8, "
                     "scales (E, 2I, K/32) u8, biases; other linears unquantized")  # fmt: skip
    if method in ("awq", "awq_marlin"):
        bits = _int_field(config, "bits", _int_field(config, "w_bit", 4, where), where, (4,))
        group = _int_field(config, "group_size", _int_field(config, "q_group_size", 128, where), where)
        return Quant("awq_marlin", "awq", bits=bits, group_size=max(group, 0), symmetric=False, marlin=True,
                     ignore=_patterns(config.get("modules_to_not_convert"), where),
                     source="layers/quantization/awq.py create_weights (qweight, qzeros, scales); awq_marlin.py "
                     "repacks them for Marlin on compute capability 8.0+ (vLLM's default for AWQ there)")  # fmt: skip
    if method in ("gptq", "gptq_marlin"):
        bits = _int_field(config, "bits", 4, where, (2, 3, 4, 8))
        group = _int_field(config, "group_size", 128, where)
        sym = config.get("sym", True) is not False
        desc = bool(config.get("desc_act", False))
        marlin = sym and bits in (4, 8)
        listed = bool(config.get("modules_in_block_to_quantize"))
        return Quant("gptq_marlin" if marlin else "gptq", "gptq", bits=bits, group_size=max(group, 0),
                     symmetric=sym, act_order=desc, marlin=marlin, layers_listed=listed,
                     source="layers/quantization/gptq.py create_weights (qweight, g_idx, qzeros, scales); "
                     "gptq_marlin.py for symmetric 4/8-bit: repacked, qzeros and an unused g_idx dropped")  # fmt: skip
    if method in ("modelopt", "modelopt_fp4"):
        algo = str(config.get("quant_algo") or (config.get("quantization") or {}).get("quant_algo", ""))[:30] \
            if isinstance(config.get("quantization", {}), dict) else ""  # fmt: skip
        nested = isinstance(config.get("quantization"), dict)
        by_key = (
            () if nested else tuple((key, _patterns(config.get(key), where)) for key in ("ignore", "exclude_modules"))
        )
        exclude = _patterns(config["quantization"].get("exclude_modules"), where) if nested else \
            dict(by_key)["ignore"]  # fmt: skip
        if algo.upper() == "FP8":
            return Quant("modelopt", "fp8-tensor", static_input=True, ignore=exclude, ignore_by_key=by_key,
                         nested=nested, lm_head=True,
                         source="layers/quantization/modelopt.py ModelOptFp8LinearMethod: fp8 weight, f32 "
                         "weight_scale and input_scale per shard")  # fmt: skip
        if algo.upper() == "NVFP4":
            return Quant("modelopt_fp4", "nvfp4", bits=4, group_size=16, marlin=True, ignore=exclude,
                         ignore_by_key=by_key, nested=nested, lm_head=True,
                         source="layers/quantization/modelopt.py ModelOptNvFp4LinearMethod: (out, in/2) u8, fp8 "
                         "scales per 16, weight_scale_2 and input_scale; Marlin FP4 on GPUs without FP4 tensor "
                         "cores (Hopper)")  # fmt: skip
        raise QuantConfigError(f"{where}.quant_algo = {algo!r}; vLLM's modelopt accepts FP8, NVFP4")
    if method == "compressed-tensors":
        return _compressed_tensors(config, where)
    raise QuantConfigError(f"{where}.quant_method = {_shown(method)} is not one this plan sizes; it sizes: fp8, "
                           "fbgemm_fp8, mxfp4, awq, gptq, modelopt (FP8, NVFP4), compressed-tensors")  # fmt: skip


def _ignored(config: dict, where: str) -> tuple[str, ...]:
    return _patterns(config.get("ignored_layers") or config.get("modules_to_not_convert"), where)


def _compressed_tensors(config: dict, where: str) -> Quant:
    """compressed-tensors: the first config group's weights scheme (compressed_tensors.py _get_scheme_from_parts)."""
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise QuantConfigError(f"{where}.config_groups = {_shown(groups)}; compressed-tensors needs at least "
                               "one group with a weights scheme")  # fmt: skip
    group = next(iter(groups.values()))
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        raise QuantConfigError(f"{where}.config_groups weights = {_shown(weights)} is not a JSON object")
    acts = group.get("input_activations")
    fmt = str(config.get("format") or group.get("format") or "")[:40]
    kind = weights.get("type", "int")
    bits = _int_field(weights, "num_bits", 8, f"{where}.weights", (4, 8))
    strategy = str(weights.get("strategy", "tensor"))
    ignore = _patterns(config.get("ignore"), f"{where}.ignore")
    if fmt == "nvfp4-pack-quantized" or (kind == "float" and bits == 4):
        return Quant("compressed-tensors", "nvfp4", bits=4, group_size=16, marlin=True, ignore=ignore,
                     source="compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py (W4A16 Marlin FP4 on "
                     "Hopper): weight_packed (out, in/2) u8, weight_scale (out, in/16) fp8, weight_global_scale, "
                     "input_global_scale")  # fmt: skip
    if acts is None or fmt == "pack-quantized":  # weight-only: WNA16
        gsize = weights.get("group_size")
        group_size = gsize if type(gsize) is int and gsize > 0 else 0
        return Quant(
            "compressed-tensors",
            "wna16",
            bits=bits,
            group_size=group_size,
            symmetric=weights.get("symmetric", True) is not False,
            act_order=weights.get("actorder") == "group",
            marlin=True,
            ignore=ignore,
            source="compressed_tensors/schemes/compressed_tensors_wNa16.py: weight_packed (out, in x "
            f"{bits}/32) int32, weight_scale (out, in/{group_size or 'in'}), weight_shape; Marlin "
            "(MarlinLinearKernel), compressed_tensors_moe.py CompressedTensorsWNA16MarlinMoEMethod",
        )
    if kind == "float" and bits == 8:
        scheme = "fp8-block" if strategy == "block" else "fp8-channel" if strategy == "channel" else "fp8-tensor"
        block = weights.get("block_structure")
        blk = (block[0], block[1]) if isinstance(block, list) and len(block) == 2 and all(
            type(b) is int and b > 0 for b in block) else None  # fmt: skip
        return Quant("compressed-tensors", scheme, block=blk, ignore=ignore, static_input=_static(acts),
                     source="compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py: fp8 weight + f32 "
                     f"weight_scale per {strategy}")  # fmt: skip
    if kind == "int" and bits == 8:
        return Quant("compressed-tensors", "int8-channel" if strategy == "channel" else "int8-tensor", ignore=ignore,
                     static_input=_static(acts),
                     symmetric=weights.get("symmetric", True) is not False,
                     source="compressed_tensors/schemes/compressed_tensors_w8a8_int8.py: int8 weight + f32 "
                     f"weight_scale per {strategy}")  # fmt: skip
    raise QuantConfigError(f"{where}: weights type {_shown(kind)} num_bits {bits} format {_shown(fmt)} is not a "
                           "compressed-tensors scheme this plan sizes (W4A16/W8A16, W8A8 FP8/INT8, NVFP4)")  # fmt: skip


def _static(acts: object) -> bool:
    return isinstance(acts, dict) and acts.get("dynamic") is False and acts.get("strategy") == "tensor"


def online_fp8() -> Quant:
    """`--quantization fp8` of an unquantized checkpoint: Fp8Config(is_checkpoint_fp8_serialized=False), every
    linear but the embeddings and lm_head quantized per tensor after loading (fp8.py process_weights_after_loading:
    ops.scaled_fp8_quant gives one f32 scale per logical shard)."""
    return Quant("fp8", "fp8-tensor", online=True,
                 source="--quantization fp8: layers/quantization/fp8.py, the checkpoint's weights quantized per "
                 "tensor on load")  # fmt: skip
