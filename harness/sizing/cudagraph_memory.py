"""The V1 model runner's CUDA-graph memory estimate, the one the memory profile subtracts from the KV budget.

vLLM 0.19.0-0.30.0's V1 runner (v1/worker/gpu_model_runner.py `profile_cudagraph_memory`, called by
v1/worker/gpu_worker.py `determine_available_memory` after `profile_run` unless cudagraph_mode is NONE, subtracted
while VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on) captures, per mode of `cudagraph_dispatcher.get_capture_descs()`
(PIECEWISE first, then FULL; each mode's batch sizes largest first), the first two graphs into one throwaway graph
pool, each sample `mem_before - free_after` of `torch.accelerator.get_memory_info()` (the driver's free memory):

    first_capture[mode] = the first sample (the largest size)
    per_graph[mode]     = max(the second sample, 1 MiB)       ("Use at least 1 MiB per graph for driver overhead")
    total = max over modes of first_capture + sum over modes of (n_mode - 1) x per_graph[mode]
            ("FULL and PIECEWISE graphs share the global pool ... Take the max")

The graphs counted (exact, vLLM 0.26.0):
    capture sizes   config/vllm.py `_set_cudagraph_sizes`: max_cudagraph_capture_size defaults to
                    min(max_num_seqs x (1 + speculative tokens) x 2, 512), capped at max_num_batched_tokens; sizes
                    [1, 2, 4] + range(8, min(max + 1, 256), 8) + range(256, max + 1, 16), plus max_num_batched_tokens
                    when it is within the largest; or the given cudagraph_capture_sizes up to max_num_batched_tokens
    mode            config/compilation.py `cudagraph_mode` (default FULL_AND_PIECEWISE), downgraded by
                    `resolve_cudagraph_mode_and_sizes`: an attention builder with AttentionCGSupport.NEVER
                    (model_executor/layers/attention/chunked_local_attention.py ChunkedLocalAttentionBuilder) turns
                    FULL decode graphs into PIECEWISE
    graphs per mode v1/cudagraph_dispatcher.py `initialize_cudagraph_keys`: the mixed mode (PIECEWISE of
                    FULL_AND_PIECEWISE, FULL of FULL) at every capture size; with a separate decode routine
                    (FULL_AND_PIECEWISE, FULL_DECODE_ONLY) FULL at the sizes <= max_num_seqs x (1 + spec tokens)

What one capture holds (estimate): `_warmup_and_capture` runs cudagraph_num_of_warmups eager forwards (1: config/
vllm.py sets it whenever graphs are captured) and then captures, all on the fresh stream of `graph_capture()` after
`torch.accelerator.empty_cache()`:
    cuBLAS workspace   PyTorch's, one per stream through the caching allocator (harness.sizing.profile_run
                       cublas_workspace): the capture stream's is new at the first capture
    forward            the forward's transients at that size (harness.sizing.profile_run forward_phase) counted
                       twice: what the caching allocator's new segments hold for the warm-up and for the capture in
                       the fresh profiling graph pool, where tensors of 1-10 MiB take 20 MiB segments and smaller ones
                       2 MiB blocks (PyTorch's CUDACachingAllocator kLargeBuffer, kSmallBuffer), more than the tensors
                       themselves. The live set of the compiled pieces is not read, so the segment count is not
                       derived: twice the transients is the approximation (Qwen3-MoE: 37 MiB against the 38 logged at
                       64 tokens, 75 against 76 at 512, 43 against 60 at 128, where one 20 MiB segment is the
                       difference). An MLA model's pieces are read from its
                       graph pool's segments instead (mla_pool: DeepSeek-V3's 132 MiB at 512 tokens, where twice its
                       transients would be 200). A later mode's first capture reuses what the earlier one left in
                       both pools
    FULL attention     FlashAttention's split-KV accumulators, allocated inside the FULL graph: the metadata builder
                       sets num_splits to attention_config.flash_attn_max_num_splits_for_cuda_graph (32) under full
                       CUDA graphs (v1/attention/backends/flash_attn.py FlashAttentionMetadataBuilder.__init__ and
                       build: "intermediate buffers of size [num_splits, num_heads, num_tokens, head_size] are
                       allocated"), out_accum and softmax_lse_accum in float32, one layer's at a time; MLA's
                       FLASH_ATTN_MLA the same with the latent kv_lora_rank as the head size (mla/flashattn_mla.py).
                       Sparse MLA's FLASH_ATTN_MLA_SPARSE (mla/flashattn_mla_sparse.py forward_mqa, 0.26.0 and
                       0.30.0) passes no num_splits: FlashAttention 3 picks them (fa3_sparse_mla_splits). Over
                       992 sequences FlashAttention 3 takes one split whatever it is asked, and then allocates none.
                       FLASHMLA_SPARSE with an fp8 cache: FlashMLA's sparse decode allocates its own split-KV
                       buffers in each call (flashmla_sparse_accumulators). An MLA model's attention also makes its
                       output buffer and the kernel's output, (N, heads, kv_lora) bf16 each, which go where a block
                       the PIECEWISE captures freed holds them (LargePool, mla_attention_large_script)
    MLA stand-in       a PIECEWISE warm-up runs without attention metadata, so an MLA layer makes and frees its
                       profile stand-in (rows, heads, qk_nope + v); where the first cuBLAS GEMM follows the first
                       attention, the capture stream's workspace is cut from a freed stand-in block and keeps that
                       whole segment through the capture's empty_cache, in place of its own (held_mla_stand_in)
    shared experts     with shared experts, a forward of at most VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD tokens
                       (envs.py, 256) runs them on the aux stream (model_executor/layers/fused_moe/runner/
                       shared_experts.py: MULTI_STREAM_OVERLAPPED; utils/torch_utils.py aux_stream), which the profile
                       run (max_num_batched_tokens) never used: the first measured capture at or under the threshold
                       adds that stream's cuBLAS workspace and, warm-up and graph pool, the shared MLP's transients in
                       the stream's own blocks (a clone of the input, gate_up, act_fn, the output); block-FP8 shared
                       experts run no cuBLAS GEMM and hold their tensors in that stream's segments
                       (shared_stream_bytes)
    experts kernel     an experts kernel that allocates its own tensors in each call, outside vLLM's kept workspace
                       (the monolithic Triton MXFP4 kernel: fused_moe/experts/gpt_oss_triton_kernels_moe.py), leaves
                       them in the first capture's graph pool, each of at least 10 MiB in its own segment
                       (pool_segments); the warm-up's are released by the capture's empty_cache
    logits gather      `_dummy_run`'s (min(tokens, max_num_seqs), hidden) gather after the captured forward, on the
                       capture stream outside the graph pool: a new segment at the profile's first capture unless a
                       held segment has room (logits_gather_segment; MLA models, whose pool is read by segments)
    small pool         MLA's captures: the first layer's requests of at most 1 MiB played through the
                       allocator's small pool (SmallPool, mla_first_layer_script); a tensor under 1 MiB at the
                       second size that was over it at the first can open a 2 MiB segment, the per-graph sample
    graph exec         the driver's memory for the instantiated graphs (measured, below; the per-graph sample is
                       this alone: the warm-up's new blocks are released by the empty_cache of torch.cuda.graph's
                       entry at the first piece, and the capture's tensors reuse the first capture's blocks in the
                       profiling pool)

The driver's graph-exec memory, measured on one H200 (driver 580.159.04, CUDA 13.0, torch 2.11;
results/h200/cudagraph-exec: free memory around each instantiation, in bare graphs and in vLLM 0.26.0's own
profiling captures with each graph's nodes counted). The free-memory figure moves in 2 MiB pages, and two kinds of
allocation fill them:
    per graph       two objects, 64 and 48 KiB, each from its own run of pages (112 KiB a graph, 7 pages every 128
                    graphs, whatever the node count): counted from the profile's first instantiated graph, the
                    64 KiB run opens a page at the 9th graph and every 32nd after it, the 48 KiB run at the 36th and
                    every 128/3 after it (the same counts in the bare graphs and in vLLM's captures)
    per node        a block of about 1840 bytes a kernel node (2 MiB per about 1140 nodes of 16- and 64-node
                    graphs), one block a graph, from a page open and empty when the profile begins; a block that
                    does not fit in what the page has left opens a new one
The kernel nodes of a graph are the compiled code's, not vLLM's source: 15 a layer's piece graph and 18 a layer
in a FULL graph (its attention's too), as counted in vLLM 0.26.0's captures of Qwen3-30B-A3B (15, FULL 18),
Mixtral-8x7B (14-15, FULL 17) and gpt-oss-20b (14, FULL 18) on the H200.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.units import MIB, round_up
from harness.sizing.deployment_weights import MIN_LARGE_ALLOC, ROUND_LARGE
from harness.sizing.gpus import Gpu
from harness.sizing.model_config import ModelFacts
from harness.sizing.profile_run import (
    SHARED_EXPERTS_STREAM_TOKENS,
    cublas_workspace,
    forward_phase,
    gpu_facts,
    query_quant_fused,
)

PER_GRAPH_FLOOR = 1 << 20  # gpu_model_runner.py profile_cudagraph_memory: max(second sample, 1 << 20)
DEFAULT_MAX_SPLITS = 32  # config/attention.py AttentionConfig.flash_attn_max_num_splits_for_cuda_graph (0.19-0.30)
DRIVER_PAGE = 2 * MIB  # the free-memory figure moves in the driver's 2 MiB pages
# Measured, the driver's memory for instantiated graphs (module docstring; results/h200/cudagraph-exec): per graph,
# (object bytes, the graph, counted from the profile's first, at which the object's run opens its first page).
GRAPH_OBJECTS = ((64 * 1024, 9), (48 * 1024, 36))
NODE_EXEC = 1840  # a kernel node's share of its graph's block (16- and 64-node graphs: 2 MiB per ~1140 nodes)
NODES_PER_PIECE = 15  # kernel nodes of a layer's piece graph (vLLM 0.26.0 captures, H200: 14-15)
NODES_PER_LAYER_FULL = 18  # kernel nodes a layer adds to a FULL graph, its attention's included (17-18)
# The releases before 0.26.0, measured on their own stack (the published 0.19.0 H100 logs, torch 2.10): 6 MiB a
# graph in either mode for a 32-layer capture (tests/data/startup_logs/llama-3.1-8b-tp1-h100.yaml's log: "(51-1) x
# 6.00 MiB per-graph"), taken per layer, a PIECEWISE capture rounding up and a FULL one down.
EXEC_PER_LAYER = 6 * MIB // 32
DEFAULT_MODE = "FULL_AND_PIECEWISE"  # config/compilation.py CompilationConfig.cudagraph_mode's default (V1)


def pool_segments(tensors: list[int]) -> int:
    """What tensors allocated in a fresh graph pool take of it: one of at least 10 MiB gets its own segment rounded up
    to 2 MiB (PyTorch's CUDACachingAllocator kMinLargeAlloc, kRoundLarge); smaller ones are counted at their size,
    cut from segments the forward's transients already open. Measured: gpt-oss's first PIECEWISE capture at 1024
    tokens keeps its Triton MXFP4 experts' (4096, 2880) bf16 blocks in 24 MiB segments each
    (results/h200/startup-gaps)."""
    return sum(round_up(t, ROUND_LARGE) if t >= MIN_LARGE_ALLOC else t for t in tensors)


def capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, max_capture: int | None = None,
                  sizes: list[int] | None = None, spec_tokens: int = 0) -> list[int]:  # fmt: skip
    """The capture sizes, ascending (vLLM 0.26.0 config/vllm.py `_set_cudagraph_sizes`)."""
    largest = max_capture if max_capture is not None else min(max_num_seqs * (1 + spec_tokens) * 2, 512)
    largest = min(max_num_batched_tokens, largest)
    if sizes is not None:
        return sorted({s for s in sizes if s <= max_num_batched_tokens})
    out = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        out += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        out += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        out.append(max_num_batched_tokens)
    return sorted(set(out))


# Architectures whose config hook raises the largest capture size when neither cudagraph_capture_sizes nor
# max_cudagraph_capture_size is set (vLLM 0.26.0 model_executor/models/config.py: GptOssForCausalLMConfig
# verify_and_update_config, "Increase the max capture size from 512 to 1024 for performance"; the startup logs
# "Overriding max cuda graph capture size to 1024", and gpt-oss-4l's PIECEWISE=83 (largest=1024)).
MODEL_MAX_CAPTURE = {"GptOssForCausalLM": 1024}


def model_max_capture(facts: ModelFacts) -> int | None:
    """The largest capture size the architecture's config hook sets when the user sets none; None: the default."""
    return MODEL_MAX_CAPTURE.get(facts.architecture)


def full_graphs_always(facts: ModelFacts, capability: int) -> bool:
    """Whether every attention builder supports FULL graphs of mixed batches (AttentionCGSupport.ALWAYS):
    FlashAttention 3 (compute capability 9.x, flash_attn.py) and TRITON_ATTN (float32); FlashAttention 2, the MLA
    backends and the linear-attention ones (gdn_attn.py, mamba_attn.py) support uniform batches only."""
    if facts.is_mla or "linear" in facts.kinds:
        return False
    return facts.dtype_bytes == 4 or capability == 9


def resolve_mode(facts: ModelFacts, mode: str | None, capability: int = 9) -> tuple[str, str]:
    """(the mode the runner captures, why): the given or default mode after the attention backends' support
    (config/compilation.py resolve_cudagraph_mode_and_sizes; attention is a splitting op by default)."""
    chosen = mode or DEFAULT_MODE
    why = "given" if mode else "config/compilation.py default"
    full_decode = chosen in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    if full_decode and "chunked" in facts.kinds:
        # AttentionCGSupport.NEVER with attention split piecewise -> PIECEWISE
        return "PIECEWISE", (f"{chosen} ({why}) -> PIECEWISE: chunked local attention's builder supports no CUDA "
                             "graph (chunked_local_attention.py: AttentionCGSupport.NEVER)")  # fmt: skip
    if chosen == "FULL" and not full_graphs_always(facts, capability):
        # mixed_mode FULL without AttentionCGSupport.ALWAYS -> FULL_AND_PIECEWISE
        return "FULL_AND_PIECEWISE", (f"FULL ({why}) -> FULL_AND_PIECEWISE: an attention backend supports full graphs "
                                      "of uniform batches only")  # fmt: skip
    return chosen, why


def capture_descs(mode: str, sizes: list[int], *, max_num_seqs: int,
                  spec_tokens: int = 0) -> list[tuple[str, list[int]]]:  # fmt: skip
    """(runtime mode, sizes largest first) in capture order, PIECEWISE then FULL (v1/cudagraph_dispatcher.py
    initialize_cudagraph_keys and get_capture_descs)."""
    mixed = {"FULL_AND_PIECEWISE": "PIECEWISE", "FULL_DECODE_ONLY": "NONE"}.get(mode, mode)
    separate = mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")
    keys: dict[str, set[int]] = {"PIECEWISE": set(), "FULL": set()}
    if mixed != "NONE":
        keys[mixed] |= set(sizes)
    if separate:
        q = 1 + spec_tokens
        keys["FULL"] |= {s for s in sizes if q <= s <= q * max_num_seqs}
    return [(m, sorted(keys[m], reverse=True)) for m in ("PIECEWISE", "FULL") if keys[m]]


def combine(modes: list[tuple[int, int, int]]) -> int:
    """profile_cudagraph_memory's total from (graphs, first_capture, per_graph) per mode."""
    if not modes:
        return 0
    return max(first for _, first, _ in modes) + sum((n - 1) * per for n, _, per in modes)


@dataclass(frozen=True)
class ModeEstimate:
    mode: str
    graphs: int
    largest: int
    first_capture: int
    per_graph: int
    detail: str


@dataclass(frozen=True)
class GraphEstimate:
    mode: str
    modes: tuple[ModeEstimate, ...]
    total: int
    detail: str


def piece_graphs(facts: ModelFacts) -> int:
    """PIECEWISE graphs per capture: the compiled graph is split at each layer's attention op (and linear
    attention's), one piece before each and one after the last (compilation/backends.py split_graph)."""
    return facts.num_hidden_layers + 1


def graph_nodes(mode: str, facts: ModelFacts) -> tuple[int, int]:
    """(graphs, kernel nodes a graph) one capture of `mode` instantiates."""
    if mode == "PIECEWISE":
        return piece_graphs(facts), NODES_PER_PIECE
    return 1, facts.num_hidden_layers * NODES_PER_LAYER_FULL


def object_pages(first: int, last: int) -> int:
    """The pages the per-graph objects open while graphs first..last (counted from the profile's first) are
    instantiated."""
    pages = 0
    for size, opens_at in GRAPH_OBJECTS:
        step = DRIVER_PAGE / size  # graphs a page holds
        k = max(0, int((first - opens_at) // step) - 1)
        while (at := math.ceil(opens_at + k * step)) <= last:
            pages += at >= first
            k += 1
    return pages


def layer_exec_bytes(mode: str, facts: ModelFacts) -> int:
    """The per-layer scaling of the releases before 0.26.0 (EXEC_PER_LAYER), in whole driver pages."""
    layers = facts.num_hidden_layers * EXEC_PER_LAYER
    if mode == "PIECEWISE":  # at most half a MiB a piece graph, rounded down, where the pieces are few
        return min(piece_graphs(facts) * MIB // 2 // DRIVER_PAGE * DRIVER_PAGE, round_up(layers, DRIVER_PAGE))
    return layers // DRIVER_PAGE * DRIVER_PAGE


@dataclass
class ExecPool:
    """The driver's graph-exec memory over the profile's captures: the graphs instantiated so far and the used
    bytes of the node blocks' open page."""

    graphs: int = 0
    node_used: int = 0

    def capture(self, mode: str, facts: ModelFacts) -> int:
        """The bytes (whole pages) one capture of `mode` adds."""
        graphs, nodes = graph_nodes(mode, facts)
        pages = object_pages(self.graphs + 1, self.graphs + graphs)
        self.graphs += graphs
        block = nodes * NODE_EXEC
        for _ in range(graphs):
            if self.node_used + block > DRIVER_PAGE:
                opened = -(-block // DRIVER_PAGE)
                pages += opened
                self.node_used = block - (opened - 1) * DRIVER_PAGE
            else:
                self.node_used += block
        return pages * DRIVER_PAGE


def split_head_size(facts: ModelFacts, *, capability: int, kv_cache_dtype: str = "auto") -> int:
    """The value head size of FlashAttention's split-KV accumulators under full graphs, 0 where another backend
    runs the FULL graph's attention. FlashAttention (v1/attention/backends/flash_attn.py) is what vLLM picks on
    compute capability 8.x and 9.x for 16-bit attention of head size <= 256 (float32 takes TRITON_ATTN, Blackwell
    FlashInfer: platforms/cuda.py); for MLA, FLASH_ATTN_MLA on 9.x with a 16-bit KV cache (fp8 takes FlashMLA), whose
    value is the latent kv_lora_rank wide (mla/flashattn_mla.py: v=kv_c_cache, the same max_num_splits)."""
    if capability not in (8, 9) or facts.dtype_bytes != 2:
        return 0
    if facts.is_mla:
        return facts.kv_lora_rank if capability == 9 and not kv_cache_dtype.startswith("fp8") else 0
    kinds = set(facts.kinds)
    return facts.head_dim if kinds & {"full", "sliding"} and 0 < facts.head_dim <= 256 else 0


# FlashAttention 3's own split count, where the caller passes none (num_splits 0), as the fork vLLM builds has it
# (vllm-project/flash-attention, hopper/flash_api.cpp mha_fwd and get_num_splits, hopper/heuristics.h
# num_splits_heuristic, hopper/tile_size.h tile_size_fwd_sm90; those files unchanged there from 2026-01-16 to
# 2026-08-06, vLLM 0.26.0's wheel is of 2026-07-25). Measured: DeepSeek-V3.2's FULL capture at 256 tokens on the H200
# keeps 28 x (128, 256, 512) f32 of accumulators (results/h200/startup-gaps), the 28 this gives.
FA3_MAX_SPLITS = 128  # get_num_splits: num_splits_heuristic(..., 128)
FA3_L2_BYTES = 50 * 1024 * 1024  # num_splits_heuristic: "we assume that L2 size is 50MB"
FA3_VARLEN_MAX_BATCHES = 992  # PREPARE_VARLEN_MAX_BATCHES_1CTA: "disable split for varlen and >992 batches"


def _f32(x: float) -> float:
    """x rounded to a C float, as the heuristic computes."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def fa3_splits_heuristic(total_mblocks: int, num_sms: int, num_n_blocks: int, num_m_blocks: int,
                         size_one_kv_head: int, causal_or_local: bool,
                         max_splits: int = FA3_MAX_SPLITS) -> int:  # fmt: skip
    """hopper/heuristics.h num_splits_heuristic: the fewest splits within 85% of the best wave efficiency."""
    if total_mblocks >= _f32(0.8 * num_sms):
        if size_one_kv_head > FA3_L2_BYTES and num_m_blocks >= num_sms * 2 and not causal_or_local:
            return min(-(-size_one_kv_head // FA3_L2_BYTES), max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    efficiency = []
    for splits in range(1, max_splits + 1):
        waves = _f32(total_mblocks * splits / num_sms)
        efficiency.append(_f32(waves / math.ceil(waves)))
    floor = _f32(0.85 * max(efficiency))
    return next((i + 1 for i, eff in enumerate(efficiency) if eff >= floor), 1)


def fa3_mla_tile(head_size: int, head_size_v: int) -> tuple[int, int] | None:
    """(kBlockM, kBlockN) of tile_size_fwd_sm90 for a 16-bit query of head size <= 64 with a wider value (q_v: MLA's
    rope part as the query, the latent as the value); None for the shapes not read here."""
    if head_size > 64 or head_size_v not in (256, 512):
        return None
    return (64, 64) if head_size_v == 512 else (128, 96)


def fa3_sparse_mla_splits(facts: ModelFacts, num_tokens: int, tp: int, num_sms: int) -> int | None:
    """The splits FlashAttention 3 picks for FLASH_ATTN_MLA_SPARSE's decode call (forward_mqa: one query a sequence,
    max_seqlen_q 1, the rope part (qk_rope wide) as q, the latent as q_v and v, one KV head, a page table of the
    index_topk selected tokens, so max_seqlen_k is index_topk). mha_fwd: a one-token query is not causal here
    (head size <= 64); varlen over at most 992 sequences splits dynamically, so get_num_splits takes the batch as
    1 and the heads packed (PackGQA) into the m blocks; more than 992 sequences (here tokens: forward_mqa's
    cu_seqlens_q is one a token) take one split, whatever the caller asked. None where the tile of the model's
    head sizes is not read (fa3_mla_tile)."""
    if num_tokens > FA3_VARLEN_MAX_BATCHES:
        return 1
    d, dv, topk = facts.qk_rope_head_dim, facts.kv_lora_rank, facts.index_topk
    tile = fa3_mla_tile(round_up(d, 8), dv)
    if tile is None:
        return None
    block_m, block_n = tile
    heads = max(1, facts.num_attention_heads // tp)
    m_blocks = -(-heads // block_m)
    n_blocks = -(-topk // block_n)
    return fa3_splits_heuristic(m_blocks, num_sms, n_blocks, m_blocks, topk * (d + dv) * 2, False)


def split_accumulators(facts: ModelFacts, num_tokens: int, tp: int, max_splits: int, *, capability: int = 9,
                       kv_cache_dtype: str = "auto") -> int:  # fmt: skip
    """out_accum (splits, heads, tokens, head_size) f32 + softmax_lse_accum (splits, heads, tokens) f32; none for one
    split (mha_fwd allocates them only where num_splits > 1)."""
    size = split_head_size(facts, capability=capability, kv_cache_dtype=kv_cache_dtype)
    if not size or max_splits <= 1:
        return 0
    heads = max(1, facts.num_attention_heads // tp)
    return max_splits * heads * num_tokens * (size + 1) * 4


# FlashMLA's sparse decode (FLASHMLA_SPARSE with its fp8_ds_mla cache) allocates its split-KV buffers in each call
# (FlashMLA csrc/api/sparse_decode.h sparse_attn_decode_interface: lse_accum (b + num_sm_parts, s_q, h_q) and o_accum
# (b + num_sm_parts, s_q, h_q, d_v) in float32, d_v 512), num_sm_parts as vLLM 0.26.0's
# v1/attention/backends/mla/flashmla_sparse.py restates it from there: num_sms / s_q / (h_q / 64) on 9.x, num_sms /
# s_q on 10.x, at least 1. h_q is the heads padded to 64 or 128 (_compute_fp8_decode_padded_heads). Under
# MIN_HEADS_FOR_BF16_PREFILL heads a rank the builder runs every token as one batch (fp8_use_mixed_batch: b 1, s_q the
# tokens); else the FULL graph's uniform decode batch is one query token per request (b the tokens, s_q 1).
FLASHMLA_V_HEAD = 512
FLASHMLA_MIXED_BATCH_BELOW = 32  # flashmla_sparse.py MIN_HEADS_FOR_BF16_PREFILL


def flashmla_sparse_grid(facts: ModelFacts, num_tokens: int, tp: int, *, capability: int, num_sms: int,
                         kv_cache_dtype: str = "auto") -> tuple[int, int, int, int] | None:  # fmt: skip
    """FlashMLA sparse decode's (b, s_q, padded heads, num_sm_parts) at a FULL capture of num_tokens (above); None
    where FLASHMLA_SPARSE's fp8 decode does not run the FULL graph's attention."""
    if not facts.index_topk or not kv_cache_dtype.startswith("fp8") or capability not in (9, 10):
        return None
    heads = max(1, facts.num_attention_heads // tp)
    padded = 64 if heads <= 64 else 128
    batch, s_q = (1, num_tokens) if heads < FLASHMLA_MIXED_BATCH_BELOW else (num_tokens, 1)
    parts = max(num_sms // s_q // (padded // 64 if capability == 9 else 1), 1)
    return batch, s_q, padded, parts


def flashmla_sparse_accumulators(facts: ModelFacts, num_tokens: int, tp: int, *, capability: int, num_sms: int,
                                 kv_cache_dtype: str = "auto") -> tuple[int, str]:  # fmt: skip
    """FlashMLA sparse decode's lse_accum and o_accum at a FULL capture of num_tokens (above), and how they were
    sized; 0 where FLASHMLA_SPARSE's fp8 decode does not run the FULL graph's attention."""
    grid = flashmla_sparse_grid(facts, num_tokens, tp, capability=capability, num_sms=num_sms,
                                kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    if grid is None:
        return 0, ""
    batch, s_q, padded, parts = grid
    return (batch + parts) * s_q * padded * (FLASHMLA_V_HEAD + 1) * 4, (
        f"FlashMLA sparse decode's lse_accum and o_accum, ({batch} + {parts} SM parts, {s_q}, {padded} heads, "
        f"{FLASHMLA_V_HEAD} + 1) f32"
    )


def shared_transients(facts: ModelFacts, num_tokens: int, tp: int) -> int:
    """The shared experts' MLP on the aux stream: the input's clone and the output (N, K), gate_up (N, 2 I) and
    act_fn's (N, I), I the shared intermediate size over TP; 0 without shared experts."""
    inter = facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size
    if not facts.is_moe or not inter:
        return 0
    d = facts.dtype_bytes
    return num_tokens * (2 * facts.hidden_size + 3 * (inter // tp)) * d


def shared_stream_bytes(facts: ModelFacts, num_tokens: int, tp: int, workspace: int) -> tuple[int, str]:
    """What the first capture at or under the aux-stream threshold adds for the shared experts there: (bytes, how).
    Unquantized, their GEMMs go through cuBLAS, whose workspace is new on that stream, and their transients take new
    blocks in the warm-up and in the graph pool (shared_transients). Block FP8 (weight_block_size: vLLM's W8A8 block
    kernels), no cuBLAS GEMM runs there: the stream's own pools hold the input's fp8 copy (N, K), gate_up (N, 2 I) and
    the output (N, K) bf16 in large segments, the group scales and act_fn's (N, I) with its fp8 copy in small ones
    (CachingPool). Measured (results/h200/startup-gaps, sixth batch): DeepSeek-V3.2 and DeepSeek-V3 cut to four
    layers at 256 tokens, a 20 MiB and a 2 MiB segment on the aux stream, per_token_group_quant_fp8's, and no
    workspace."""
    inter = (facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size) // tp
    if facts.weight_block_size is None or not inter:
        return workspace + 2 * shared_transients(facts, num_tokens, tp), "its cuBLAS workspace and transients"
    N, K = num_tokens, facts.hidden_size
    script = [("alloc", "x_scales", N * (K // 128) * 4), ("alloc", "x_fp8", N * K),
              ("alloc", "gate_up", N * 2 * inter * 2), ("alloc", "act", N * inter * 2), ("alloc", "act_fp8", N * inter),
              ("alloc", "act_scales", N * (inter // 128) * 4), ("alloc", "out", N * K * 2)]  # fmt: skip
    large, small = LargePool(), SmallPool()
    large.run(script)
    small.run(script)
    return (
        large.made + small.made,
        "block FP8: no cuBLAS workspace; the input's fp8 copy, gate_up and the output "
        f"in {large.made} B of large segments, the scales and act_fn's in {small.made} B of small ones",
    )


# Where every GEMM of the captured forward is a block-FP8 one (weight_block_size: vLLM's W8A8 block kernels, CUTLASS,
# DeepGEMM or Triton, none through cuBLAS), no cuBLAS GEMM runs on the capture stream and it gets no workspace: the
# architectures whose router gate takes the checkpoint's quantization (the attention and experts always do). Measured
# on the H200 (results/h200/startup-gaps): qwen3-moe-4l-fp8block-kvfp8's first piece capture makes no 32 MiB segment,
# warm-up or graph pool. An MLA model's absorbed attention multiplies in bf16 (torch.bmm) and keeps it.
QUANTIZED_ROUTER_GATE = {"Qwen3MoeForCausalLM": "models/qwen3_moe.py Qwen3MoeSparseMoeBlock: self.gate = "
                                                "ReplicatedLinear(..., quant_config=quant_config)"}  # fmt: skip


def first_cublas_after_attention(facts: ModelFacts) -> tuple[bool, str]:
    """Whether the captured forward's first cuBLAS GEMM comes after layer 0's attention, and why: an MLA model whose
    linears before the attention are all block FP8 (DeepSeek-V3's fused_qkv_a_proj, q_b_proj: models/deepseek_v2.py
    passes them the quant config), so the first cuBLAS GEMM is the first MoE layer's router gate (GateLinear,
    unquantized). DeepSeek-V3.2's indexer multiplies in bf16 before the attention (models/deepseek_v2.py Indexer:
    wk_weights_proj with quant_config=None), as does an unquantized checkpoint's q_a_proj."""
    if not facts.is_mla or facts.weight_block_size is None:
        return False, "a cuBLAS GEMM before the first attention (unquantized linears)"
    if facts.index_topk:
        return False, "the sparse indexer's bf16 wk_weights_proj runs before the first attention"
    return True, "every linear before the first attention is block FP8; the first cuBLAS GEMM is a later layer's"


def held_mla_stand_in(facts: ModelFacts, *, tp: int, rows: int, mode: str) -> tuple[int, str]:
    """The segment of MLA's profile stand-in that the capture stream's cuBLAS workspace keeps: (bytes, why), 0 when
    none is kept.

    A PIECEWISE capture's warm-up runs without attention metadata (gpu_model_runner.py `_warmup_and_capture`:
    force_attention only for FULL), so each MLA layer's forward_impl makes its profile stand-in, a
    (rows, heads, qk_nope + v) tensor (mla_attention.py 0.26.0:706, `_ = torch.empty(...)`, one segment of its own),
    and frees it on return. Where the first cuBLAS GEMM comes after that (first_cublas_after_attention), PyTorch
    carves the capture stream's workspace, kept for the stream's life, out of a freed stand-in block, and the
    capture's `empty_cache` cannot release that segment: the first sample holds it whole in place of the
    workspace's own segment. Measured (allocator history, results/h200/startup-gaps): DeepSeek-V3 cut to four
    layers, block FP8, 512 tokens: the 32 MiB workspace live in a 2048 MiB stand-in segment through the capture,
    2180 MiB first-capture logged; DeepSeek-V3.2 keeps the workspace in its own 32 MiB segment (its indexer's GEMM
    comes first)."""
    if mode != "PIECEWISE" or not rows or not facts.is_mla:
        return 0, ""
    after, _ = first_cublas_after_attention(facts)
    if not after or not capture_runs_cublas(facts):
        return 0, ""
    heads = max(1, facts.num_attention_heads // tp)
    size = rows * heads * (facts.qk_nope_head_dim + facts.v_head_dim) * facts.dtype_bytes
    segment = round_up(size, ROUND_LARGE)
    return segment, (
        f"MLA's profile stand-in ({rows}, {heads}, {facts.qk_nope_head_dim + facts.v_head_dim}) x "
        f"{facts.dtype_bytes} B, its {segment} B segment kept by the capture stream's cuBLAS workspace "
        "(the warm-up runs without attention metadata; the first cuBLAS GEMM follows the attention)"
    )


SMALL_SEGMENT = 20 * MIB  # CUDACachingAllocator kLargeBuffer: the segment tensors of 1-10 MiB are cut from
SMALL_BLOCK = 2 * MIB  # kSmallBuffer: the segment tensors under 1 MiB are cut from
MIN_BLOCK = 512  # kMinBlockSize: every request rounds up to a multiple of it
SMALL_SIZE = 1 * MIB  # kSmallSize: requests up to it take the small pool's 2 MiB segments


def mla_pool(facts: ModelFacts, num_tokens: int, tp: int) -> tuple[int, str]:
    """What an MLA model's compiled pieces leave in a fresh graph pool at one capture size: (bytes, detail).

    Read from the allocator's history of first PIECEWISE captures (results/h200/startup-gaps, second and sixth
    batches) and from the compiled attention piece (the Inductor output of vLLM 0.26.0 on torch 2.11): DeepSeek-V3 cut
    to four layers at 512 tokens made 36 + 24 + 24 + 24 + 20 + 2 + 2 MiB of pool segments and DeepSeek-V3.2 at 1024
    tokens 72 + 48 + 48 + 48 + 16 + 14 + 14 + 20 + 2 + 2: the dense layer's gate_up output (N, 2 I), three tensors of
    the query's size (N, heads x (qk_nope + qk_rope)), the sparse indexer's query (N, index_n_heads x index_head_dim)
    and two of the hidden size (N, K: the attention piece returns the residual and the normed input, live through
    it), each of at least 10 MiB in a segment of its own rounded to 2 MiB (pool_segments), the smaller ones (with the
    pieces' unnamed tensors of 1-10 MiB) in 20 MiB segments, as many as their bytes fill and at least one, and two
    2 MiB small-block segments. Where more than one piece makes the same shape, the pool's freed blocks serve the
    later ones: the counts are what the segments showed, not a count of the source's tensors. Against the three:
    132 MiB planned at DeepSeek-V3's 512 tokens (132 made), 152 at DeepSeek-V3.2's 512 (152 in the graph pool, and
    the logits gather's 20 MiB segment beside it: logits_gather_segment) and 284 at its 1024 (284, and the gather's
    14)."""
    N = num_tokens
    named = _mla_pool_named(facts, num_tokens, tp)
    large = [(what, n, size) for what, n, size in named if size >= MIN_LARGE_ALLOC]
    small = sum(n * size for _, n, size in named if size < MIN_LARGE_ALLOC)
    segments = max(1, -(-small // SMALL_SEGMENT))
    total = sum(mla_pool_segments(facts, num_tokens, tp)) + 2 * SMALL_BLOCK
    parts = [f"{n} x {what} {size} B" for what, n, size in large]
    return total, (f"MLA's graph pool at {N} tokens {total} B = " + " + ".join([*parts, f"{segments} x 20 MiB "
                   f"segments of the smaller ones ({small} B of them named)", "two 2 MiB small blocks"])
                   + " (segments rounded to 2 MiB)")  # fmt: skip


def _mla_pool_named(facts: ModelFacts, num_tokens: int, tp: int) -> list[tuple[str, int, int]]:
    """mla_pool's tensors as (what, count, bytes each)."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    heads = max(1, facts.num_attention_heads // tp)
    named: list[tuple[str, int, int]] = []
    if len(facts.moe_layers) < facts.num_hidden_layers and facts.intermediate_size:
        named.append(("the dense MLP's gate_up", 1, N * 2 * (facts.intermediate_size // tp) * d))
    named.append(("query-sized", 3, N * heads * (facts.qk_nope_head_dim + facts.qk_rope_head_dim) * d))
    if facts.index_topk:
        named.append(("the indexer's query", 1, N * facts.index_n_heads * facts.index_head_dim * d))
    named.append(("hidden-sized", 2, N * K * d))
    return named


def mla_pool_segments(facts: ModelFacts, num_tokens: int, tp: int) -> list[int]:
    """The large segments of mla_pool (its two small blocks aside), in the order the pieces make them."""
    named = _mla_pool_named(facts, num_tokens, tp)
    small = sum(n * size for _, n, size in named if size < MIN_LARGE_ALLOC)
    own = [round_up(size, ROUND_LARGE) for _, n, size in named if size >= MIN_LARGE_ALLOC for _ in range(n)]
    return own + [SMALL_SEGMENT] * max(1, -(-small // SMALL_SEGMENT))


def logits_gather_segment(facts: ModelFacts, num_tokens: int, max_num_seqs: int, held: int) -> tuple[int, str]:
    """The segment `_dummy_run`'s logits gather takes at the profile's first capture: (bytes, detail).

    After the captured forward, `_dummy_run` returns `hidden_states[logit_indices_device]` (v1/worker/
    gpu_model_runner.py 0.26.0:6167), one row of the hidden size for each of its min(tokens, max_num_seqs) requests,
    allocated outside the graph on the capture stream, where the default pool holds only what the capture's
    `empty_cache` could not release. One of at most 1 MiB takes a block of that stream's small segment (the capture's
    begin makes it: mla_pool's second small block); a larger one a new 20 MiB segment (1-10 MiB) or its own; none
    where MLA's held stand-in segment (held_mla_stand_in) has the room. A later capture's `empty_cache` releases it
    and its gather makes it again, so only the first sample grows. Measured (allocator history, results/h200/
    startup-gaps): DeepSeek-V3.2 at 512 tokens, 256 requests, a (256, 7168) bf16 gather in a 20 MiB segment of its
    own; DeepSeek-V3, with the stand-in held, none."""
    rows = min(num_tokens, max_num_seqs)
    size = rows * facts.hidden_size * facts.dtype_bytes
    if held or size <= SMALL_SIZE:
        return 0, ""
    segment = SMALL_SEGMENT if size < MIN_LARGE_ALLOC else round_up(size, ROUND_LARGE)
    return segment, f"the logits gather ({rows}, {facts.hidden_size}) {size} B in a {segment} B segment"


class CachingPool:
    """One stream's pool of small or of large blocks in one graph pool, as PyTorch's CUDACachingAllocator
    (c10/cuda/CUDACachingAllocator.cpp) keeps it. A request, rounded up to 512 B (kMinBlockSize), takes the smallest
    free block that holds it, the lowest address first (BlockComparatorSize), at the block's start, split where the
    rest is worth a block (should_split: at least 512 B in the small pool, over 1 MiB in the large); where no free
    block holds it, a new segment (get_allocation_size). The small pool takes requests of at most 1 MiB (kSmallSize)
    in 2 MiB segments (kSmallBuffer); the large pool the rest, in 20 MiB segments (kLargeBuffer) under 10 MiB
    (kMinLargeAlloc), else in one of the request's size rounded up to 2 MiB (kRoundLarge). A freed block merges with
    its free neighbours in the segment (try_merge_blocks). Segments are ordered as they were made, for the address
    order; `made` counts the bytes of the segments opened."""

    small = True

    def __init__(self, segments: int | list[int] = 0) -> None:
        self.segments = 0
        self.made = 0
        self.free: list[tuple[int, int, int]] = []  # (segment, offset, bytes)
        self.live: dict[str, tuple[int, int, int]] = {}
        sizes = [SMALL_BLOCK] * segments if isinstance(segments, int) else segments
        for size in sizes:
            self._new_segment(size)
        self.made = 0

    def _segment_size(self, size: int) -> int:
        if self.small:
            return SMALL_BLOCK
        return SMALL_SEGMENT if size < MIN_LARGE_ALLOC else round_up(size, ROUND_LARGE)

    def _new_segment(self, size: int) -> tuple[int, int, int]:
        block = (self.segments, 0, size)
        self.free.append(block)
        self.segments += 1
        self.made += size
        return block

    def alloc(self, key: str, nbytes: int) -> None:
        size = max(MIN_BLOCK, round_up(nbytes, MIN_BLOCK))
        if (size <= SMALL_SIZE) != self.small:
            return  # the other pool's
        fits = [b for b in self.free if b[2] >= size]
        block = min(fits, key=lambda b: (b[2], b[0], b[1])) if fits else self._new_segment(self._segment_size(size))
        self.free.remove(block)
        segment, offset, have = block
        if have - size >= MIN_BLOCK if self.small else have - size > SMALL_SIZE:
            self.free.append((segment, offset + size, have - size))
            have = size
        self.live[key] = (segment, offset, have)

    def release(self, key: str) -> None:
        if key not in self.live:
            return
        segment, offset, size = self.live.pop(key)
        for b in list(self.free):
            if b[0] == segment and b[1] + b[2] == offset:
                self.free.remove(b)
                offset, size = b[1], b[2] + size
            elif b[0] == segment and offset + size == b[1]:
                self.free.remove(b)
                size += b[2]
        self.free.append((segment, offset, size))

    def run(self, script: list[tuple[str, str, int]]) -> int:
        """Plays a capture's allocations and frees, then frees what is left (the capture's end); the segments it
        opened."""
        before = self.segments
        for op, key, nbytes in script:
            if op == "alloc":
                self.alloc(key, nbytes)
            else:
                self.release(key)
        for key in list(self.live):
            self.release(key)
        return self.segments - before


class SmallPool(CachingPool):
    """The small-block pool (CachingPool)."""


class LargePool(CachingPool):
    """The large-block pool (CachingPool), `segments` the sizes of the free segments it starts with."""

    small = False


def mla_first_layer_script(facts: ModelFacts, num_tokens: int, tp: int, *, full: bool, fa_attention: bool = False,
                           fa_splits: int = 0, flashmla: tuple[int, int, int, int] | None = None
                           ) -> list[tuple[str, str, int]]:  # fmt: skip
    """The graph pool's requests in a capture's first MLA layer, in their order: (op, tensor, bytes); empty where the
    compiled piece is not read (no q_lora_rank, or not block FP8). A PIECEWISE capture holds the attention piece
    alone (the attention runs between the piece graphs, outside the pool); a FULL one the attention call too.

    The attention piece, as Inductor compiles vLLM 0.26.0's DeepSeek-V2 MLA with block-FP8 linears on torch 2.11
    (its output code, results/h200/startup-gaps sixth batch: every buffer, in its order, and each `del`): the
    residual (N, K) bf16, the activation's fp8 copy (N, K) and group scales (N, K / 128) f32, which go once the fused
    q_a/kv_a GEMM has its output (N, q_lora + kv_lora + rope) bf16. DeepSeek-V3 then quantizes the normed q_c to fp8
    (N, q_lora) with its scales (N, q_lora / 128) f32, multiplies q_b into (N, heads x (nope + rope)), makes k_pe
    (N, rope) and the normed kv_c (N, kv_lora) in bf16, the roped query (N, heads, nope + rope) and the attention's
    output (N, heads x v). DeepSeek-V3.2 keeps the normed input (N, K) bf16 too, and its indexer more alive at once:
    its wk/weights projection (N, index_head_dim + index_n_heads), its k's norm and rope (N, index_head_dim) each,
    k_pe, q_c in bf16 (two GEMMs read it) and kv_c, all made before the fused output goes; then q_c's fp8 copy and
    scales, q_b's output, the indexer's query (N, index_n_heads x index_head_dim) bf16, its fp8 copy and weights
    (N, index_n_heads) f32, the roped query and the output. After the piece, as the allocator's history shows: the
    indexer's inputs go once it has run; kv_c and k_pe once the attention has. The attention call of a FULL graph
    adds:
    - FLASH_ATTN_MLA: cu_seqlens (N + 1) int32 and softmax_lse (heads, N) f32, and the split-KV lse (splits, heads,
      N) f32 (split_accumulators' other part);
    - FLASH_ATTN_MLA_SPARSE: the global indices (N, index_topk) and (N) int32, two (N + 1) int32, softmax_lse, the
      scheduler's (2 N + 1) int32 and FlashAttention 3's split lse;
    - FLASHMLA_SPARSE (fp8 cache): the indices, (N) int32, softmax_lse (padded heads, N) f32, the tile scheduler's
      (SM parts, 8) and num_splits (N + 1) int32 (kept past the call) and the split lse (b + SM parts, s_q, padded
      heads) f32 (flashmla_sparse_accumulators).
    A SmallPool takes the requests of at most 1 MiB and skips the rest (the large pool's): which are small moves with
    N and the heads. `fa_attention`: FlashAttention runs the attention (split_head_size), with `fa_splits` splits;
    `flashmla`: FlashMLA's sparse decode runs it, its (b, s_q, padded heads, SM parts) (flashmla_sparse_grid)."""
    if facts.q_lora_rank is None or facts.weight_block_size is None:
        return []
    N, K, R = num_tokens, facts.hidden_size, facts.qk_rope_head_dim
    QL, KL = facts.q_lora_rank, facts.kv_lora_rank
    heads = max(1, facts.num_attention_heads // tp)
    qk = facts.qk_nope_head_dim + R
    out = N * heads * facts.v_head_dim * 2

    def a(key: str, nbytes: int) -> tuple[str, str, int]:
        return ("alloc", key, nbytes)

    def f(*keys: str) -> list[tuple[str, str, int]]:
        return [("free", key, 0) for key in keys]

    script = [a("residual", N * K * 2)]
    if facts.index_topk:
        ih, ik = facts.index_head_dim, facts.index_n_heads
        script += [a("normed", N * K * 2), a("x_fp8", N * K), a("x_scales", N * (K // 128) * 4),
                   a("qkv_a", N * (QL + KL + R) * 2), *f("x_fp8", "x_scales"),
                   a("indexer_wk_weights", N * (ih + ik) * 2), a("indexer_k_norm", N * ih * 2),
                   a("indexer_k", N * ih * 2), a("k_pe", N * R * 2), a("q_c", N * QL * 2), a("kv_c", N * KL * 2),
                   *f("indexer_k_norm", "qkv_a"), a("q_c_fp8", N * QL), a("q_c_scales", N * (QL // 128) * 4),
                   a("q_b", N * heads * qk * 2), *f("q_c"), a("indexer_q", N * ik * ih * 2),
                   *f("q_c_fp8", "q_c_scales"), a("indexer_q_fp8", N * ik * ih), a("indexer_weights", N * ik * 4),
                   *f("indexer_q", "indexer_wk_weights"), a("q", N * heads * qk * 2), *f("q_b"), a("out", out),
                   *f("indexer_q_fp8", "indexer_k", "indexer_weights", "normed")]  # fmt: skip
    else:
        script += [a("x_scales", N * (K // 128) * 4), a("x_fp8", N * K), a("qkv_a", N * (QL + KL + R) * 2),
                   *f("x_scales", "x_fp8"), a("q_c_scales", N * (QL // 128) * 4), a("q_c_fp8", N * QL),
                   a("q_b", N * heads * qk * 2), *f("q_c_fp8", "q_c_scales"), a("k_pe", N * R * 2),
                   a("kv_c", N * KL * 2), *f("qkv_a"), a("q", N * heads * qk * 2), *f("q_b"),
                   a("out", out)]  # fmt: skip
    if full:
        topk = [a("global_indices", N * facts.index_topk * 4), a("indices_lens", N * 4)]
        split_lse = [a("split_lse", fa_splits * heads * N * 4)] if fa_splits > 1 else []
        if flashmla and facts.index_topk:
            batch, s_q, padded, parts = flashmla
            script += [*topk, a("softmax_lse", padded * N * 4), a("tile_scheduler", parts * 8 * 4),
                       a("num_splits", (N + 1) * 4), a("split_lse", (batch + parts) * s_q * padded * 4),
                       *f("split_lse", "softmax_lse", "indices_lens", "global_indices")]  # fmt: skip
        elif fa_attention and facts.index_topk:
            script += [*topk, a("cu_seqlens_q", (N + 1) * 4), a("cu_seqlens_k", (N + 1) * 4),
                       a("softmax_lse", heads * N * 4), a("scheduler", (2 * N + 1) * 4), *split_lse,
                       *f("scheduler", "cu_seqlens_k", "softmax_lse", "split_lse", "global_indices", "indices_lens",
                          "cu_seqlens_q")]  # fmt: skip
        elif fa_attention:
            script += [a("cu_seqlens", (N + 1) * 4), a("softmax_lse", heads * N * 4), *split_lse,
                       *f("cu_seqlens", "softmax_lse", "split_lse")]  # fmt: skip
    return script + f("kv_c", "k_pe")


def full_attention_splits(facts: ModelFacts, num_tokens: int, tp: int, *, capability: int, num_sms: int,
                          max_num_seqs: int, max_splits: int, sparse: bool = True) -> tuple[int, str]:  # fmt: skip
    """The splits FlashAttention runs a capture's attention with, and why: FlashAttention 3's own pick for sparse MLA
    (fa3_sparse_mla_splits, a FULL graph's decode), one over 992 of _dummy_run's min(tokens, max_num_seqs) requests
    on 9.x, else attention_config's."""
    if sparse and facts.index_topk and (picked := fa3_sparse_mla_splits(facts, num_tokens, tp, num_sms)):
        return picked, "FlashAttention 3's heuristic, sparse MLA"
    if capability == 9 and min(num_tokens, max_num_seqs) > FA3_VARLEN_MAX_BATCHES:
        return 1, f"over {FA3_VARLEN_MAX_BATCHES} sequences"
    return max_splits, "attention_config's"


def mla_attention_large_script(facts: ModelFacts, num_tokens: int, tp: int, *, fa_splits: int,
                               flashmla: tuple[int, int, int, int] | None) -> list[tuple[str, str, int]]:  # fmt: skip
    """The large requests of a FULL graph's MLA attention call, in their order: MLA's output buffer (N, heads,
    kv_lora) bf16 (mla_attention.py 0.26.0:843), the kernel's own output of that shape (FlashAttention's varlen out;
    FlashMLA's with the heads padded) and its split-KV buffers (split_accumulators, flashmla_sparse_accumulators).
    A LargePool seeded with the segments the PIECEWISE captures left takes them: the outputs go where a freed block
    holds them, the rest in new segments. Measured (results/h200/startup-gaps, sixth batch): at 256 tokens with 128
    heads the output buffer (32 MiB) took the dense MLP's 36 MiB gate_up segment and the kernel's a new 32 MiB one;
    with 16 heads both (4 MiB) went into a 20 MiB segment's room; with 128 requests (16 MiB) into the 18 and 20 MiB
    segments of a PIECEWISE capture at 256."""
    N, KL = num_tokens, facts.kv_lora_rank
    heads = max(1, facts.num_attention_heads // tp)
    script = [("alloc", "mla_output", N * heads * KL * 2)]
    if flashmla:
        batch, s_q, padded, parts = flashmla
        script += [("alloc", "kernel_out", N * padded * FLASHMLA_V_HEAD * 2),
                   ("alloc", "o_accum", (batch + parts) * s_q * padded * FLASHMLA_V_HEAD * 4),
                   ("alloc", "lse_accum", (batch + parts) * s_q * padded * 4)]  # fmt: skip
    else:
        script.append(("alloc", "kernel_out", N * heads * KL * 2))
        if fa_splits > 1:
            script += [("alloc", "out_accum", fa_splits * heads * N * KL * 4),
                       ("alloc", "lse_accum", fa_splits * heads * N * 4)]  # fmt: skip
    return script


def full_attention_kernel(facts: ModelFacts, num_tokens: int, tp: int, *, capability: int, num_sms: int,
                          max_num_seqs: int, max_splits: int, kv_cache_dtype: str = "auto"
                          ) -> tuple[bool, int, tuple[int, int, int, int] | None]:  # fmt: skip
    """What runs a FULL graph's MLA attention at num_tokens as the plan has it: (FlashAttention, its splits or 0,
    FlashMLA sparse decode's grid or None)."""
    fa = split_head_size(facts, capability=capability, kv_cache_dtype=kv_cache_dtype) > 0
    splits = full_attention_splits(facts, num_tokens, tp, capability=capability, num_sms=num_sms,
                                   max_num_seqs=max_num_seqs, max_splits=max_splits)[0] if fa else 0  # fmt: skip
    grid = flashmla_sparse_grid(facts, num_tokens, tp, capability=capability, num_sms=num_sms,
                                kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    return fa, splits, grid


def capture_small_script(facts: ModelFacts, num_tokens: int, tp: int, *, mode: str, capability: int, num_sms: int,
                         max_num_seqs: int, max_splits: int,
                         kv_cache_dtype: str = "auto") -> list[tuple[str, str, int]]:  # fmt: skip
    """mla_first_layer_script for a capture of `mode` at num_tokens with the attention backend the plan has there."""
    if mode != "FULL":
        return mla_first_layer_script(facts, num_tokens, tp, full=False)
    fa, splits, grid = full_attention_kernel(facts, num_tokens, tp, capability=capability, num_sms=num_sms,
                                             max_num_seqs=max_num_seqs, max_splits=max_splits,
                                             kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    return mla_first_layer_script(facts, num_tokens, tp, full=True, fa_attention=fa, fa_splits=splits, flashmla=grid)


def capture_runs_cublas(facts: ModelFacts) -> bool:
    """Whether the captured forward runs a cuBLAS GEMM (and so makes the capture stream's workspace): False where
    every linear of the decoder is block FP8 (QUANTIZED_ROUTER_GATE), not MLA, without shared experts (their gate
    is unquantized)."""
    shared = facts.num_shared_experts or facts.shared_expert_intermediate_size
    return not (facts.weight_block_size is not None and facts.architecture in QUANTIZED_ROUTER_GATE
                and not facts.is_mla and not shared)  # fmt: skip


def estimate(facts: ModelFacts, *, tp: int, max_num_seqs: int, max_num_batched_tokens: int,
             mode: str | None = None, max_capture: int | None = None, sizes: list[int] | None = None,
             gpu: str | Gpu | None = None, max_splits: int = DEFAULT_MAX_SPLITS,
             shared_stream_threshold: int | None = SHARED_EXPERTS_STREAM_TOKENS,
             kv_cache_dtype: str = "auto", exec_pages: bool = True,
             experts_call: Callable[[int], list[int]] | None = None, mla_rows: int = 0) -> GraphEstimate:  # fmt: skip
    """The estimate profile_cudagraph_memory prints ("Estimated CUDA graph memory: X GiB total"). `exec_pages`: the
    driver's graph-exec memory as measured under 0.26.0's stack (ExecPool); False, the per-layer scaling of the
    earlier releases' logs (release_defaults.graph_exec_pages says which). `experts_call`: the tensors an experts
    kernel allocates itself in one call of n tokens, outside vLLM's kept workspace (the monolithic Triton MXFP4
    kernel's), which the first capture's graph pool keeps (pool_segments). `mla_rows`: the rows of MLA's
    chunked-prefill workspace (profile_run.mla_workspace_rows), the size of its profile stand-in
    (held_mla_stand_in)."""
    capability, num_sms, _ = gpu_facts(gpu)
    chosen, why = resolve_mode(facts, mode, capability)
    if chosen == "NONE":
        return GraphEstimate("NONE", (), 0, "cudagraph_mode NONE: no graphs, no estimate")
    if max_capture is None and sizes is None:
        max_capture = model_max_capture(facts)
    found = capture_sizes(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_capture=max_capture, sizes=sizes)  # fmt: skip
    descs = capture_descs(chosen, found, max_num_seqs=max_num_seqs)
    workspace, _ = cublas_workspace(gpu)
    capture_ws = workspace if capture_runs_cublas(facts) else 0
    modes: list[ModeEstimate] = []
    pool = 0  # the transients the profiling pool (and the default pool) already hold
    call_pool = 0  # the experts kernel's own tensors the graph pool already holds
    aux_used = shared_stream_threshold is None or not shared_transients(facts, 1, tp)
    exec_pool = ExecPool()
    fa_full = split_head_size(facts, capability=capability, kv_cache_dtype=kv_cache_dtype) > 0
    small_pool = SmallPool(segments=1)  # the graph pool's small segment on the capture stream (mla_pool's first)
    large_pool = LargePool()  # the graph pool's large segments, free between captures

    def splits_at(size: int, sparse: bool = True) -> tuple[int, str]:
        return full_attention_splits(facts, size, tp, capability=capability, num_sms=num_sms,
                                     max_num_seqs=max_num_seqs, max_splits=max_splits, sparse=sparse)  # fmt: skip

    query_fp8 = query_quant_fused(kv_cache_dtype, compiled=True)  # the captured forward is the compiled one
    for index, (name, graph_sizes) in enumerate(descs):
        aux = [0, 0]  # what the aux stream adds to the first and second sample
        for sample, size in enumerate(graph_sizes[:2]):
            if not aux_used and shared_stream_threshold is not None and size <= shared_stream_threshold:
                aux[sample] = shared_stream_bytes(facts, size, tp, workspace)[0]
                aux_used = True
        n = graph_sizes[0]
        if facts.is_mla:  # the pieces' segments as read (mla_pool), not twice the forward's transients
            forward, pool_why = mla_pool(facts, n, tp)
        else:
            forward, pool_why = forward_phase(facts, num_tokens=n, tp=tp, query_fp8=query_fp8).bytes, ""
        new = max(0, forward - pool)
        twice = 1 if facts.is_mla else 2
        splits, how = splits_at(n, sparse=name == "FULL")
        small = [0, 0]  # the small-pool segments a capture of an MLA model opens (SmallPool)
        if facts.is_mla:
            for sample, size in enumerate(graph_sizes[:2]):
                script = capture_small_script(facts, size, tp, mode=name, kv_cache_dtype=kv_cache_dtype,
                                              capability=capability, num_sms=num_sms, max_num_seqs=max_num_seqs,
                                              max_splits=max_splits)  # fmt: skip
                small[sample] = small_pool.run(script) * SMALL_BLOCK
        accum = split_accumulators(facts, n, tp, splits, capability=capability,
                                   kv_cache_dtype=kv_cache_dtype) if name == "FULL" else 0  # fmt: skip
        accum_part = f"split-KV accumulators {accum} B ({splits} splits, {how})" if accum else ""
        if name == "FULL" and not accum:
            accum, mla_how = flashmla_sparse_accumulators(facts, n, tp, capability=capability, num_sms=num_sms,
                                                          kv_cache_dtype=kv_cache_dtype)  # fmt: skip
            accum_part = f"{accum} B: {mla_how}" if accum else ""
        attention = [0, 0]  # the new large segments of an MLA FULL graph's attention (mla_attention_large_script)
        if facts.is_mla and name == "FULL" and accum:
            for sample, size in enumerate(graph_sizes[:2]):
                _, size_splits, grid = full_attention_kernel(facts, size, tp, capability=capability, num_sms=num_sms,
                                                             max_num_seqs=max_num_seqs, max_splits=max_splits,
                                                             kv_cache_dtype=kv_cache_dtype)  # fmt: skip
                before = large_pool.made
                large_pool.run(mla_attention_large_script(facts, size, tp, fa_splits=size_splits, flashmla=grid))
                attention[sample] = large_pool.made - before
            accum_part = (f"{attention[0]} B of new large segments for the attention's output buffers and "
                          f"{accum_part or 'its split-KV buffers'} (LargePool)")  # fmt: skip
            accum = attention[0]
        if exec_pages:
            graph_exec = exec_pool.capture(name, facts)
            second_exec = exec_pool.capture(name, facts) if len(graph_sizes) > 1 else 0
        else:
            graph_exec = second_exec = layer_exec_bytes(name, facts)
        first_ws = capture_ws if index == 0 else 0
        held, held_why = held_mla_stand_in(facts, tp=tp, rows=mla_rows, mode=name) if index == 0 else (0, "")
        call = pool_segments(experts_call(n)) if experts_call is not None else 0
        new_call, call_pool = max(0, call - call_pool), max(call_pool, call)
        gather, gather_why = (0, "")
        if facts.is_mla and index == 0:
            gather, gather_why = logits_gather_segment(facts, n, max_num_seqs, held)
        first = (held or first_ws) + twice * new + accum + aux[0] + new_call + gather + small[0] + graph_exec
        pool = max(pool, forward)
        per_graph = max(second_exec + aux[1] + small[1] + attention[1], PER_GRAPH_FLOOR)
        if facts.is_mla and name == "PIECEWISE" and not large_pool.segments:
            large_pool = LargePool(mla_pool_segments(facts, n, tp))  # free once the capture ends
        no_ws = "no cuBLAS workspace (every GEMM block FP8)" if index == 0 and not capture_ws else ""
        ws_part = f"cuBLAS workspace {first_ws} B (the capture stream's)" if first_ws else no_ws
        held_back = f", less {forward - new} B the pool holds" if new < forward else ""
        pool_part = (f"{new} B: {pool_why}{held_back}" if pool_why else
                     f"2 x {new} B forward transients at {n} tokens (warm-up, graph pool)")  # fmt: skip
        parts = [f"{held} B: {held_why}" if held else ws_part,
                 pool_part if new else "",
                 accum_part,
                 f"no split-KV accumulators (one split: {how})" if name == "FULL" and splits == 1 and fa_full else "",
                 f"shared experts' aux stream {aux[0]} B" if aux[0] else "",
                 f"the experts kernel's own tensors at {n} tokens {new_call} B (graph pool)" if new_call else "",
                 f"{gather} B: {gather_why}" if gather else "",
                 f"{small[0]} B of new small-pool segments (the first layer's small tensors)" if small[0] else "",
                 f"graph exec {graph_exec} B" if graph_exec else ""]  # fmt: skip
        if small[1]:
            parts.append(
                f"second sample: {small[1]} B of new small-pool segments at {graph_sizes[1]} tokens (the "
                "first layer's small tensors there outgrow the small segments the pool holds)"
            )
        modes.append(ModeEstimate(name, len(graph_sizes), n, first, per_graph,
                                  f"{name}={len(graph_sizes)} (largest={n}): first {first} B = "
                                  + " + ".join(p for p in parts if p) + f"; per graph {per_graph} B"))  # fmt: skip
    total = combine([(m.graphs, m.first_capture, m.per_graph) for m in modes])
    detail = "; ".join([f"cudagraph_mode {chosen} ({why})", *(m.detail for m in modes),
                        f"total = max(first captures) + sum((n - 1) x per graph) = {total} B"])  # fmt: skip
    return GraphEstimate(chosen, tuple(modes), total, detail)
