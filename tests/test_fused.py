"""The comm path's row kernels (harness.rank.comm.fused): the Triton form against the torch form and a float64
reference. On CPU the Triton form runs in Triton's interpreter (TRITON_INTERPRET=1); marked gpu, on the device."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton reads it when first imported: nothing in the tests imports it earlier
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.rank.comm.fused import bag_sum, pack_rows, place_rows  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[test]' brings it)")

BF16_ULP = 2.0**-7  # relative spacing of bf16 near 1 (8 significant bits)


HAS_CUDA = torch.cuda.is_available()


# Each case runs where its device is and is skipped, with the reason, where it is not: the interpreter case on a
# machine without CUDA (CI), the compiled case on a GPU machine (scripts/gpu/comm-graph.sh runs `-m gpu` there).
@pytest.fixture(params=[
    pytest.param("interpreter", marks=pytest.mark.skipif(
        HAS_CUDA, reason="a CUDA GPU is here: Triton compiles for it (the cuda cases) instead of interpreting")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not HAS_CUDA, reason="needs a CUDA GPU: Triton compiles the kernels for it (run with -m gpu on the device)")]),
])
def device(request):
    if request.param == "interpreter":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("TRITON_INTERPRET is set to something other than 1: Triton would not interpret")
        return torch.device("cpu")
    return torch.device("cuda")


def _bags(device, *, R=37, W=5, N=300, K=1100, seed=0):
    """Random bags over src with some zero-weight cells pointing at NaN rows and out-of-range indices."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randn((N, K), generator=g).to(torch.bfloat16)
    table = torch.randint(0, N - 10, (R, W), generator=g)
    weights = torch.rand((R, W), generator=g)
    pad = torch.rand((R, W), generator=g) < 0.3
    src[N - 10:] = float("nan")  # rows only padding points at
    table = torch.where(pad, torch.randint(N - 10, N, (R, W), generator=g), table)
    weights = torch.where(pad, 0.0, weights)
    return table.to(device), weights.to(device), src.to(device)


def test_bag_sum_matches_a_float64_reference_and_skips_padding(device):
    table, weights, src = _bags(device)
    ref = (src.double()[torch.where(weights != 0, table, 0)] * weights.double().unsqueeze(-1)).sum(1)
    for impl in ("triton", "torch"):
        out = torch.full((table.shape[0], src.shape[1]), float("inf"), dtype=src.dtype, device=device)
        bag_sum(table, weights, src, out=out, impl=impl)
        assert torch.isfinite(out).all(), impl  # every element written, no NaN from a padding row
        err = (out.double() - ref).abs()
        # One bf16 rounding of the float32 sum (plus float32 noise): within half an ulp of |ref|, with room.
        assert (err <= BF16_ULP * ref.abs() + 1e-6).all(), (impl, float(err.max()))


def test_bag_sum_of_a_row_slice_with_an_offset_stride(device):
    """A (rows, K) view with a row stride wider than K (the combine buffer's slice) is read and written in place."""
    table, weights, src = _bags(device, R=9, W=2, N=50, K=64, seed=1)
    wide = torch.zeros((9, 100), dtype=src.dtype, device=device)
    out = bag_sum(table, weights, src, out=wide[:, 10:74], impl="triton")
    expect = bag_sum(table, weights, src, impl="torch")
    assert torch.equal(out, expect) or (out.float() - expect.float()).abs().max() <= BF16_ULP * expect.abs().max()
    assert (wide[:, :10] == 0).all() and (wide[:, 74:] == 0).all()


def _placement(device, *, R=23, k=4, E=6, M=9, words=70, seed=2):
    """R received rows, each with up to k distinct local experts (-1: elsewhere); expert 0 is hot (overflows M)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(E - 1, generator=g)[: k - 1]])
                       for _ in range(R)])  # distinct experts in a row, expert 0 in every one
    ids = torch.where(torch.rand((R, k), generator=g) < 0.3, -1, ids)
    weights = torch.rand((R, k), generator=g)
    payload = torch.randint(-2**62, 2**62, (R, words), generator=g, dtype=torch.int64)
    scales = torch.rand(R, generator=g)
    sources = torch.stack([torch.arange(R, dtype=torch.int32) % 3, torch.arange(R, dtype=torch.int32)], dim=1)
    return [t.to(device) for t in (payload, ids, weights, scales, sources)], (E, M)


def _place(device, inputs, E, M, impl, words):
    payload, ids, weights, scales, sources = inputs
    x = torch.full((E * M + 1, words), -7, dtype=torch.int64, device=device)
    x_scale = torch.full((E * M + 1,), -1.0, device=device)
    x_src = torch.full((E * M + 1, 2), -3, dtype=torch.int32, device=device)
    counts, table, bag_weights = place_rows(payload, ids, weights, scales, sources, x_flat=x, x_scale_flat=x_scale,
                                            x_src_flat=x_src, max_slots=M, num_experts=E, impl=impl)
    return counts, table, bag_weights, x, x_scale, x_src


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_place_rows_gives_each_pair_a_slot_of_its_expert_and_writes_the_row_there(device, impl):
    inputs, (E, M) = _placement(device)
    payload, ids, weights, scales, sources = inputs
    counts, table, bag_weights, x, x_scale, x_src = _place(device, inputs, E, M, impl, payload.shape[1])
    want_counts = torch.stack([(ids == e).sum() for e in range(E)]).to(torch.int32)
    assert torch.equal(counts, want_counts) and int(counts[0]) > M  # expert 0 overflowed: counted, not written
    placed = bag_weights != 0
    for e in range(E):  # every expert's first min(count, M) slots taken, each by one of its pairs
        rows_of_e = set(torch.nonzero((ids == e) & placed)[:, 0].tolist())
        slots = sorted(int(d) for d in table[(ids == e) & placed])
        assert slots == list(range(e * M, e * M + min(int(counts[e]), M)))
        assert {int(x_src[d, 1]) for d in slots} == rows_of_e
    for r, j in torch.nonzero(placed).tolist():
        d = int(table[r, j])
        assert torch.equal(x[d], payload[r]) and x_scale[d] == scales[r] and torch.equal(x_src[d], sources[r])
        assert bag_weights[r, j] == weights[r, j]
    assert (table[~placed] == 0).all() and int((ids >= 0).sum() - placed.sum()) == int((counts - M).clamp(min=0).sum())
    untouched = torch.ones(E * M + 1, dtype=torch.bool, device=device)
    untouched[table[placed]] = False
    assert (x[untouched] == -7).all() and (x_scale[untouched] == -1).all() and (x_src[untouched] == -3).all()


def test_place_rows_triton_in_the_interpreter_takes_the_torch_forms_slots(device):
    """Run one program after another (the interpreter), the atomics hand out slots in row order: the two forms
    agree element for element."""
    if device.type != "cpu":
        pytest.skip("on the GPU the atomics' order is the hardware's; the previous test checks the placement")
    inputs, (E, M) = _placement(device, seed=5)
    a = _place(device, inputs, E, M, "triton", inputs[0].shape[1])
    b = _place(device, inputs, E, M, "torch", inputs[0].shape[1])
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_place_rows_of_a_row_slice(device):
    """Rows read from a wider buffer (the receive buffer's payload words before the metadata)."""
    inputs, (E, M) = _placement(device, words=40, seed=3)
    payload = inputs[0]
    wide = torch.cat([payload, torch.full_like(payload[:, :5], 99)], dim=1)
    counts, table, bag_weights, x, _, _ = _place(device, [wide[:, :40], *inputs[1:]], E, M, "triton", 40)
    assert not (x == 99).any()
    r, j = torch.nonzero(bag_weights != 0)[0].tolist()
    assert torch.equal(x[int(table[r, j])], payload[r])


@pytest.mark.parametrize("top_k", [3, 8])
def test_pack_rows_triton_writes_the_torch_forms_rows(device, top_k):
    """Payload words, scale, token, rank, int16 local ids (odd top_k: padded with -1) and weights, byte for byte;
    the row padding past the words stays as it was."""
    from harness.rank.comm.base import RowFormat

    g = torch.Generator().manual_seed(top_k)
    n, K, P, E, rank = 19, 64, 3, 4, 1
    fmt = RowFormat(hidden_size=K, top_k=top_k)
    q_words = torch.randint(-2**62, 2**62, (n, K // 8), generator=g, dtype=torch.int64)
    scale = torch.rand((n, 1), generator=g)
    topk_ids = torch.stack([torch.randperm(P * E, generator=g)[:top_k] for _ in range(n)])
    topk_weights = torch.rand((n, top_k), generator=g)
    dest = torch.div(topk_ids, E, rounding_mode="floor")
    member = torch.zeros((n, P), dtype=torch.bool).scatter_(1, dest, True)
    selected = torch.nonzero(member.t())  # destination-major
    selected = selected[:, 1] * P + selected[:, 0]
    inputs = [t.to(device) for t in (q_words, scale, topk_ids, topk_weights, selected)]
    out = {}
    for impl in ("triton", "torch"):
        rows = torch.full((selected.numel(), fmt.row_bytes), 0xAB, dtype=torch.uint8, device=device)
        pack_rows(*inputs, rows, fmt=fmt, num_ranks=P, num_local_experts=E, rank=rank, impl=impl)
        out[impl] = rows
    assert torch.equal(out["triton"], out["torch"])
    words = out["torch"].view(torch.int32)[:, K // 4:]
    token = torch.div(selected, P, rounding_mode="floor").to(device)
    assert torch.equal(words[:, 1], token.to(torch.int32)) and (words[:, 2] == rank).all()
    ids = words[:, 3: 3 + fmt.id_words].contiguous().view(torch.int16)[:, :top_k]
    here = torch.div(topk_ids.to(device)[token], E, rounding_mode="floor") == (selected.to(device) % P).unsqueeze(1)
    assert torch.equal(ids == -1, ~here) and (ids[here] >= 0).all() and (ids[here] < E).all()
    assert torch.equal(out["torch"][:, :K].view(torch.int64), q_words.to(device)[token])
