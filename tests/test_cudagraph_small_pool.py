"""The CUDA caching allocator's pools in an MLA model's CUDA-graph captures, against the allocator's history of real
vLLM 0.26.0 startups on one H200 (results/h200/startup-gaps/summary6.json: the first layer's requests of at most
1 MiB on the capture stream through its attention, with the graph pool's segment and offset each got).

vLLM's estimate extrapolates the second capture of a mode: where a tensor under 1 MiB at the second size was over it
at the first, it joins the small tensors already there, and a new 2 MiB segment is the sample (DeepSeek-V3.2's
fused q_a/kv_a output, (N, 2112) bf16: 1.03 MiB at 256 tokens, 0.999 at 248)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.core.units import MIB
from harness.sizing import cudagraph_memory
from harness.sizing.cudagraph_memory import SmallPool
from harness.verify.planning import record_facts
from harness.verify.record import load_record

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = json.loads((ROOT / "results" / "h200" / "startup-gaps" / "summary6.json").read_text())
RECORDS = ROOT / "tests" / "data" / "real_startups"
# the probe's name -> the committed startup it repeated
PROBES = {"dsv32-4l-kvfp8": "dsv32-4l-kvfp8", "dsv32-4l-b": "dsv32-4l", "dsv32-4l-topk512": "dsv32-4l-topk512",
          "dsv3-4l-x": "dsv3-4l", "dsv32-4l-seqs128": "dsv32-4l-seqs128",
          "dsv32-4l-heads16": "dsv32-4l-heads16"}  # fmt: skip
H200 = dict(capability=9, num_sms=132, max_num_seqs=256, max_splits=cudagraph_memory.DEFAULT_MAX_SPLITS)


def _facts(probe: str):
    record = load_record(RECORDS / f"{PROBES[probe]}.yaml")
    return record_facts(record), (record.llm_kwargs or {}).get("kv_cache_dtype", "auto")


def _captures(probe: str) -> list[tuple[str, int]]:
    """The profile's captures in their order: PIECEWISE's two sizes, then FULL's."""
    got = SUMMARY[probe]
    return [("PIECEWISE", int(n)) for n in got["piecewise_first_layer"]] + [
        ("FULL", int(n)) for n in got["full_first_layer"]
    ]


def _played(probe: str) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """The plan's script of each capture played through one pool that starts with the graph pool's one small
    segment: (bytes, segment, offset) of each small request, in order."""
    facts, kv = _facts(probe)
    seqs = load_record(RECORDS / f"{PROBES[probe]}.yaml").settings.max_num_seqs or 256
    pool = SmallPool(segments=1)
    out = {}
    for mode, n in _captures(probe):
        got = []
        script = cudagraph_memory.capture_small_script(facts, n, 1, mode=mode, kv_cache_dtype=kv,
                                                       **dict(H200, max_num_seqs=seqs))  # fmt: skip
        for op, key, nbytes in script:
            if op == "alloc":
                pool.alloc(key, nbytes)
                if key in pool.live:
                    segment, offset, _ = pool.live[key]
                    got.append((nbytes, segment, offset))
            else:
                pool.release(key)
        for key in list(pool.live):
            pool.release(key)
        out[mode, n] = got
    return out


def _measured(probe: str, mode: str, n: int) -> list[tuple[int, int, int]]:
    rows = SUMMARY[probe]["full_first_layer" if mode == "FULL" else "piecewise_first_layer"][str(n)]
    return [(size, seg, off) for op, size, seg, off, _ in rows if op == "alloc"]


@pytest.mark.parametrize("probe", list(PROBES))
def test_the_first_layers_small_requests_land_where_the_allocator_put_them(probe):
    """Every small request of the plan's script gets the segment and offset the allocator gave it, in order, in each
    of the four captures (the measured list goes on into the next layer's piece)."""
    played = _played(probe)
    for mode, n in _captures(probe):
        measured = _measured(probe, mode, n)
        assert played[mode, n] == measured[: len(played[mode, n])], (probe, mode, n)
        assert len(played[mode, n]) >= 5


def test_the_captures_open_the_segments_the_allocator_opened():
    """The segments each capture opens, beyond the graph pool's first, as the allocator did. DeepSeek-V3.2 with
    2048 top-k, FlashAttention (bf16 cache) or FlashMLA (fp8): at 256 tokens its small tensors fit the one segment,
    at 248 the fused q_a/kv_a output joins them and kv_c opens a second: 2 MiB a FULL graph, as both startups
    logged; with 128 sequences the same happens at PIECEWISE's 248 (4 MiB a graph logged with the driver's page).
    With 512 top-k, FlashAttention's 7-split lse, (7, 128, 256) f32, is small and opens the second segment in the
    first FULL capture, and at 248 the pool has room. With 16 heads the attention's output (256, 16 x 128) bf16 is
    1 MiB, small, and opens it at 256. DeepSeek-V3 keeps fewer small tensors at once (1.37 MiB at 248): none."""
    assert (256 * 2112 * 2, 248 * 2112 * 2) == (1081344, 1047552)  # over and under kSmallSize
    opened = {}
    for probe in PROBES:
        facts, kv = _facts(probe)
        seqs = load_record(RECORDS / f"{PROBES[probe]}.yaml").settings.max_num_seqs or 256
        pool = SmallPool(segments=1)
        opened[probe], seen = [], 0
        for mode, n in _captures(probe):
            script = cudagraph_memory.capture_small_script(facts, n, 1, mode=mode, kv_cache_dtype=kv,
                                                           **dict(H200, max_num_seqs=seqs))  # fmt: skip
            opened[probe].append(pool.run(script))
            seen = max(seen, 1 + max(seg for _, seg, _ in _measured(probe, mode, n)))
            assert pool.segments == seen, (probe, mode, n)  # the segments the pool has used so far
    assert opened == {"dsv32-4l-kvfp8": [0, 0, 0, 1], "dsv32-4l-b": [0, 0, 0, 1], "dsv32-4l-topk512": [0, 0, 1, 0],
                      "dsv3-4l-x": [0, 0, 0, 0], "dsv32-4l-seqs128": [0, 1, 0, 0],
                      "dsv32-4l-heads16": [0, 0, 1, 0]}  # fmt: skip
    peak_v3 = 248 * (2112 * 2 + 12 * 4 + 1536)  # the fused output, q_c's scales and its fp8 copy
    assert peak_v3 == 1440384 <= 2 * MIB


def test_the_small_pool_by_hand():
    """Best fit, the lowest address among equals, a split only where 512 B would remain, merging on free."""
    pool = SmallPool(segments=1)
    pool.alloc("a", 1000)  # rounds to 1024
    pool.alloc("b", 600 * 1024)
    pool.alloc("c", 1 << 20)  # kSmallSize itself is small
    assert [pool.live[k][:2] for k in "abc"] == [(0, 0), (0, 1024), (0, 1024 + 600 * 1024)]
    pool.alloc("big", (1 << 20) + 1)  # the large pool's: not placed
    assert "big" not in pool.live and pool.segments == 1
    pool.release("a")
    pool.alloc("d", 512)  # the 1024 B hole is the best fit; 512 B remain, so it is split
    assert pool.live["d"] == (0, 0, 512)
    left = 2 * MIB - (1024 + 600 * 1024 + (1 << 20))
    pool.alloc("e", left - 256)  # the tail: under 512 B would remain, so the whole block is taken
    assert pool.live["e"] == (0, 1024 + 600 * 1024 + (1 << 20), left)
    pool.alloc("f", 4096)
    assert pool.live["f"][:2] == (1, 0) and pool.segments == 2
    for key in "bcde":
        pool.release(key)
    assert pool.free.count((0, 0, 2 * MIB)) == 1  # merged back into one block
    assert pool.run([("alloc", "g", 2 * MIB - 4096)]) == 0  # fits the first segment whole


def test_the_logits_gather_takes_a_segment_unless_one_has_room():
    """_dummy_run's gather of min(tokens, max_num_seqs) rows of the hidden size: a 20 MiB segment from 1 to 10 MiB,
    its own from 10 MiB, none at most 1 MiB or beside a held MLA stand-in."""
    facts, _ = _facts("dsv32-4l-b")
    assert cudagraph_memory.logits_gather_segment(facts, 512, 256, held=0) == (
        20 * MIB,
        "the logits gather (256, 7168) 3670016 B in a 20971520 B segment",
    )
    assert cudagraph_memory.logits_gather_segment(facts, 1024, 1024, held=0)[0] == 14 * MIB
    assert cudagraph_memory.logits_gather_segment(facts, 64, 256, held=0)[0] == 0  # 64 rows: 0.875 MiB
    assert cudagraph_memory.logits_gather_segment(facts, 512, 256, held=2048 * MIB)[0] == 0
    made = [s for s in SUMMARY["dsv32-4l-b"]["samples"][0]["segments_made"] if "_dummy_run" in s["by"]]
    assert [(m["segment_MiB"], m["request"]) for m in made] == [(20.0, 256 * 7168 * 2)]
    assert not [s for s in SUMMARY["dsv3-4l-x"]["samples"][0]["segments_made"] if "_dummy_run" in s["by"]]


def test_the_full_first_capture_segment_by_segment_for_deepseek_v32():
    """FULL's first capture of every DeepSeek-V3.2 startup, as logged to the MiB: the attention's output buffers
    where the PIECEWISE captures' freed blocks hold them (LargePool), its split-KV buffers, the aux stream's
    block-FP8 shared experts (a 20 and a 2 MiB segment) and the small pool's new segments. dsv32-4l: 1792 MiB of
    FlashAttention 3's 28 splits, a new 32 MiB segment for the kernel's output (MLA's own buffer took the 36 MiB
    gate_up segment), 22 on the aux stream."""
    from test_real_startups import GRAPH_LINES, PER_MODE, _graph_plan

    for name in ("dsv32-4l", "dsv32-4l-topk512", "dsv32-4l-kvfp8", "dsv32-4l-heads16", "dsv32-4l-seqs128"):
        (logged,) = [float(first) for line in GRAPH_LINES[name] for mode, first, _, _ in PER_MODE.findall(line)
                     if mode == "FULL"]  # fmt: skip
        full = next(m for m in _graph_plan(name).modes if m.mode == "FULL")
        assert abs(full.first_capture / MIB - logged) < 0.5, (name, full.first_capture / MIB, logged)
    facts, _ = _facts("dsv32-4l-b")
    pool = cudagraph_memory.LargePool(cudagraph_memory.mla_pool_segments(facts, 512, 1))
    assert cudagraph_memory.mla_pool_segments(facts, 512, 1)[0] == 36 * MIB  # the dense MLP's gate_up
    script = cudagraph_memory.mla_attention_large_script(facts, 256, 1, fa_splits=28, flashmla=None)
    assert [nbytes for _, _, nbytes in script] == [32 * MIB, 32 * MIB, 1792 * MIB, 28 * 128 * 256 * 4]
    pool.run(script)
    assert pool.made == (32 + 1792) * MIB


def test_block_fp8_shared_experts_take_no_cublas_workspace_on_the_aux_stream():
    """DeepSeek's shared expert (one of 2048) at 256 tokens: block FP8, a 20 MiB segment for the input's fp8 copy,
    gate_up and the output, and a 2 MiB one for the scales and act_fn's (the allocator's history: 20 + 2 MiB,
    per_token_group_quant_fp8's); unquantized, cuBLAS's 32 MiB workspace and twice the transients."""
    import dataclasses

    facts, _ = _facts("dsv32-4l-b")
    got, how = cudagraph_memory.shared_stream_bytes(facts, 256, 1, 32 * MIB)
    assert got == 22 * MIB and "no cuBLAS workspace" in how
    made = [(m["segment_MiB"], m["by"]) for m in SUMMARY["dsv32-4l-b"]["samples"][2]["segments_made"]
            if m["run"] == "FULL" and "fp8_utils" in m["by"]]  # fmt: skip
    assert sorted(size for size, _ in made) == [2.0, 20.0]
    bf16 = dataclasses.replace(facts, quant=None)
    assert (
        cudagraph_memory.shared_stream_bytes(bf16, 256, 1, 32 * MIB)[0]
        == 32 * MIB + 2 * 256 * (2 * 7168 + 3 * 2048) * 2
    )
