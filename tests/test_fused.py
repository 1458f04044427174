"""The comm path's row kernels (harness.rank.comm.fused): the Triton form against the torch form and a float64
reference. On CPU the Triton form runs in Triton's interpreter (TRITON_INTERPRET=1); marked gpu, on the device."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton reads it when first imported: nothing in the tests imports it earlier
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.rank.comm.fused import bag_sum, place_rows  # noqa: E402

pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[test]' brings it)")

BF16_ULP = 2.0**-7  # relative spacing of bf16 near 1 (8 significant bits)


@pytest.fixture(params=["interpreter", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "interpreter":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("a CUDA GPU is here: Triton compiles for it (the cuda cases) instead of interpreting")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
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


def _placement(device, *, R=23, k=4, E=6, M=20, words=70, seed=2):
    g = torch.Generator().manual_seed(seed)
    sink = E * M
    # distinct slots, some pairs elsewhere (sink)
    slots = torch.randperm(E * M, generator=g)[: R * k].view(R, k)
    slots = torch.where(torch.rand((R, k), generator=g) < 0.4, sink, slots)
    payload = torch.randint(-2**62, 2**62, (R, words), generator=g, dtype=torch.int64)
    scales = torch.rand(R, generator=g)
    sources = torch.randint(0, 1000, (R, 2), generator=g, dtype=torch.int32)
    return [t.to(device) for t in (slots, payload, scales, sources)], sink


def test_place_rows_writes_each_row_into_its_slots_and_nothing_else(device):
    (slots, payload, scales, sources), sink = _placement(device)
    results = {}
    for impl in ("triton", "torch"):
        x = torch.full((sink + 1, payload.shape[1]), -7, dtype=torch.int64, device=device)
        x_scale = torch.full((sink + 1,), -1.0, device=device)
        x_src = torch.full((sink + 1, 2), -3, dtype=torch.int32, device=device)
        place_rows(payload, slots, scales, sources, x_flat=x, x_scale_flat=x_scale, x_src_flat=x_src, sink=sink,
                   impl=impl)
        results[impl] = (x, x_scale, x_src)
    x, x_scale, x_src = results["triton"]
    for r, j in torch.nonzero(slots != sink).tolist():
        s = int(slots[r, j])
        assert torch.equal(x[s], payload[r]) and x_scale[s] == scales[r] and torch.equal(x_src[s], sources[r])
    untouched = torch.ones(sink + 1, dtype=torch.bool)
    untouched[slots[slots != sink].cpu()] = False
    assert (x[untouched.to(device)] == -7).all() and (x_scale[untouched.to(device)] == -1).all()
    assert (x_src[untouched.to(device)] == -3).all()  # the sink row included: nothing lands there
    for a, b in zip(results["triton"], results["torch"]):
        assert torch.equal(a, b)


def test_place_rows_of_a_row_slice(device):
    """Rows read from a wider buffer (the receive buffer's payload words before the metadata)."""
    (slots, payload, scales, sources), sink = _placement(device, words=40, seed=3)
    wide = torch.cat([payload, torch.full_like(payload[:, :5], 99)], dim=1)
    x = torch.zeros((sink + 1, 40), dtype=torch.int64, device=device)
    place_rows(wide[:, :40], slots, scales, sources, x_flat=x, x_scale_flat=torch.zeros(sink + 1, device=device),
               x_src_flat=torch.zeros((sink + 1, 2), dtype=torch.int32, device=device), sink=sink, impl="triton")
    assert not (x == 99).any()
    r, j = torch.nonzero(slots != sink)[0].tolist()
    assert torch.equal(x[int(slots[r, j])], payload[r])
