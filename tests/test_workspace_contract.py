"""The workspace contract of docs/design.md, locked to the byte.

Expected bytes are written out here from the design's formulas, independently of harness.core.contract:

    fixed  = w * E * M * (max(N, K) + max(N/2, K))          M = T * D, N = 2I (silu and gelu are gated)
    legacy = common + ws2 with the token dim M * D:
             common = max(E * M * D * max(N, K), E * M * K)  (out is not scaled: it stays (E, M, K))
             ws2    = E * M * D * max(N/2, K)
    lower-bound = the largest live set of GEMM1 -> silu_and_mul -> quant -> GEMM2 -> copy, never above fixed

The matrix keeps only combinations a scenario file accepts (the scenario validator decides), and says how
many of the grid that is.
"""

from __future__ import annotations

import itertools

import pytest

from harness.core.contract import (
    SizingArgs,
    builtin_shapes,
    fixed_shapes,
    legacy_shapes,
    live_set_bytes,
    lower_bound_shapes,
)
from harness.scenario.presets import PRESETS
from harness.scenario.schema import ScenarioError, parse_scenario

GIB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}

# (K, I): DeepSeek-V3, Qwen3-235B-A22B, Qwen3-30B-A3B, Mixtral-8x22B, then two that break FP8 row alignment.
SHAPES = [(7168, 2048), (4096, 1536), (2048, 768), (6144, 16384), (7000, 2048), (4096, 1000)]
GRID = list(
    itertools.product(
        (1, 8, 32, 64),  # D
        (1, 16),  # E
        (1, 256, 8192),  # T
        SHAPES,
        ("silu", "gelu"),
        ("bfloat16", "float16"),
    )
)


def _scenario_data(D: int, E: int, T: int, K: int, I: int, activation: str, dtype: str) -> dict:
    return {
        "model": {
            "hidden_size": K,
            "intermediate_size": I,
            "num_experts": E * D,
            "top_k": 1,
            "activation": activation,
            "workspace_dtype": dtype,
        },
        "parallel": {"num_dispatchers": D, "num_local_experts": E, "max_tokens_per_rank": T},
    }


def _valid(case: tuple) -> bool:
    D, E, T, (K, I), activation, dtype = case
    try:
        parse_scenario(_scenario_data(D, E, T, K, I, activation, dtype))
    except ScenarioError:
        return False
    return True


VALID = [case for case in GRID if _valid(case)]
MATRIX_REPORT = f"{len(VALID)} of {len(GRID)} valid"
print(f"workspace contract matrix: {MATRIX_REPORT}")


def _args(case: tuple) -> SizingArgs:
    """SizingArgs the way the scenario builds them, so the matrix runs through the real path."""
    D, E, T, (K, I), activation, dtype = case
    return parse_scenario(_scenario_data(D, E, T, K, I, activation, dtype)).sizing_args()


def _case_id(case: tuple) -> str:
    D, E, T, (K, I), activation, dtype = case
    return f"D{D}-E{E}-T{T}-K{K}-I{I}-{activation}-{dtype}"


def expected_fixed_bytes(*, E: int, T: int, D: int, K: int, I: int, w: int) -> int:
    M, N = T * D, 2 * I
    return w * E * M * (max(N, K) + max(N // 2, K))


def expected_legacy_bytes(*, E: int, T: int, D: int, K: int, I: int, w: int) -> int:
    M, N = T * D, 2 * I
    common = max(E * M * D * max(N, K), E * M * K)
    ws2 = E * M * D * max(N // 2, K)
    return w * (common + ws2)


def expected_live_set_bytes(*, E: int, T: int, D: int, K: int, I: int, w: int) -> int:
    rows, N = E * T * D, 2 * I
    fp8 = 1
    steps = [
        rows * N * w,  # 1 GEMM1: mm1_out
        rows * (N * w + I * w),  # 2 silu_and_mul: mm1_out + act_out
        rows * (I * w + I * fp8),  # 3 quant: act_out + quant_out
        rows * (I * fp8 + K * w),  # 4 GEMM2: quant_out + mm2_out
        rows * (K * w + K * w),  # 5 copy: mm2_out + out
    ]
    return max(steps)


def test_matrix_is_built_from_valid_combinations_only():
    # The grid holds two misaligned shapes (K=7000, I=1000) out of six; the validator drops exactly those.
    print(f"workspace contract matrix: {MATRIX_REPORT}")
    assert MATRIX_REPORT == f"{len(GRID) * 4 // 6} of {len(GRID)} valid"
    assert all(case[3] not in ((7000, 2048), (4096, 1000)) for case in VALID)


@pytest.mark.parametrize("case", VALID, ids=_case_id)
def test_fixed_and_legacy_bytes(case):
    D, E, T, (K, I), _activation, dtype = case
    args = _args(case)
    w = DTYPE_BYTES[dtype]
    assert (args.M, args.N, args.K) == (T * D, 2 * I, K)

    fixed = fixed_shapes(args)
    assert fixed.ws13 == (E, T * D, max(2 * I, K))
    assert fixed.ws2 == (E, T * D, max(I, K))
    assert fixed.out == (E, T * D, K)
    assert fixed.total_bytes == expected_fixed_bytes(E=E, T=T, D=D, K=K, I=I, w=w)

    legacy = legacy_shapes(args)
    assert legacy.ws13 == (E, T * D * D, max(2 * I, K))
    assert legacy.ws2 == (E, T * D * D, max(I, K))
    assert legacy.out == fixed.out  # the PR changed ws13 and ws2 only
    assert legacy.total_bytes == expected_legacy_bytes(E=E, T=T, D=D, K=K, I=I, w=w)
    assert legacy.total_bytes == D * fixed.total_bytes
    assert legacy.common_bytes == w * E * T * D * D * max(2 * I, K)


@pytest.mark.parametrize("case", VALID, ids=_case_id)
def test_lower_bound_is_the_live_set_and_never_above_fixed(case):
    D, E, T, (K, I), _activation, dtype = case
    args = _args(case)
    expected = expected_live_set_bytes(E=E, T=T, D=D, K=K, I=I, w=DTYPE_BYTES[dtype])
    assert live_set_bytes(args) == expected
    assert lower_bound_shapes(args).total_bytes == expected
    assert expected <= fixed_shapes(args).total_bytes


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_lower_bound_equals_fixed_for_every_preset(preset):
    # Every preset has K >= N or N/2 >= K, where max(N,K) + max(N/2,K) is one step's live set exactly.
    p = PRESETS[preset]
    args = SizingArgs(
        max_tokens_per_rank=256,
        num_dispatchers=8,
        num_local_experts=2,
        num_global_experts=16,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        top_k=p.top_k,
    )
    assert lower_bound_shapes(args).total_bytes == fixed_shapes(args).total_bytes


def test_lower_bound_below_fixed_between_n_half_and_n():
    # N/2 < K < N: fixed reserves max(N,K) + max(N/2,K) = N + K per row, more than any step holds at once.
    args = SizingArgs(
        max_tokens_per_rank=4,
        num_dispatchers=2,
        num_local_experts=1,
        num_global_experts=2,
        hidden_size=3072,
        intermediate_size=2048,
        top_k=1,
    )
    assert lower_bound_shapes(args).total_bytes == 8 * (3072 * 2 + 3072 * 2)  # step 5: mm2_out + out
    assert fixed_shapes(args).total_bytes == 8 * 2 * (4096 + 3072)


def test_worked_case_deepseek_v3_dp32():
    """vLLM PR #55579: DeepSeek-V3 (K=7168, I=2048), D=32, E=16, T=256 -> M=8192."""
    scenario = parse_scenario(
        {
            "model": {"preset": "deepseek-v3"},
            "parallel": {"num_dispatchers": 32, "num_local_experts": 16, "max_tokens_per_rank": 256},
        }
    )
    args = scenario.sizing_args()
    assert args.M == 8192
    fixed, legacy = fixed_shapes(args), legacy_shapes(args)
    assert fixed.total_bytes == 3758096384 == int(3.5 * GIB)
    assert legacy.total_bytes == 120259084288 == 112 * GIB
    assert legacy.total_bytes / fixed.total_bytes == 32
    assert lower_bound_shapes(args).total_bytes == fixed.total_bytes
    # The two buffers vLLM allocates: common (ws13 aliased by out) and ws2, 56 GiB each under legacy.
    assert legacy.common_bytes == legacy.ws2_bytes == 56 * GIB
    assert fixed.common_bytes == fixed.ws2_bytes == int(1.75 * GIB)


def test_default_tokens_case_is_56_gib_even_when_fixed():
    """vLLM's newer default T = 8192 at D=32, E=8: the fixed sizing alone is 56 GiB per GPU."""
    scenario = parse_scenario(
        {
            "model": {"preset": "deepseek-v3"},
            "parallel": {"num_dispatchers": 32, "num_local_experts": 8, "max_tokens_per_rank": 8192},
        }
    )
    args = scenario.sizing_args()
    assert fixed_shapes(args).total_bytes == 60129542144 == 56 * GIB
    assert legacy_shapes(args).total_bytes == 32 * 56 * GIB


def test_builtin_shapes_dispatches_by_name_and_rejects_others():
    args = _args(VALID[0])
    assert builtin_shapes("legacy", args) == legacy_shapes(args)
    assert builtin_shapes("fixed", args) == fixed_shapes(args)
    assert builtin_shapes("lower-bound", args) == lower_bound_shapes(args)
    with pytest.raises(ValueError, match=r"policy 'fixd' is not one of legacy, fixed, lower-bound or vllm==X.Y.Z"):
        builtin_shapes("fixd", args)


def test_ungated_activation_has_n_equal_i():
    # The *_no_mul activations do not split GEMM1's output, so N = I and act_out is N wide.
    args = SizingArgs(
        max_tokens_per_rank=2,
        num_dispatchers=2,
        num_local_experts=1,
        num_global_experts=2,
        hidden_size=64,
        intermediate_size=512,
        top_k=1,
        activation="silu_no_mul",
    )
    assert (args.N, args.activation_out_dim) == (512, 512)
    assert fixed_shapes(args).total_bytes == 2 * 1 * 4 * (512 + 512)
