"""The profile run's torch peak: what vLLM's memory profiler calls `torch_peak_increase`, the peak of torch's
allocated bytes while `model_runner.profile_run()` runs, over what was allocated when it began
(v1/worker/gpu_worker.py:372-386 in vLLM 0.19.0). The buffers the MoE layers keep (the workspace, DeepEP's) are
sized elsewhere (held once); this module sizes the rest, from vLLM 0.19.0's source (the published logs' release).

profile_run (v1/worker/gpu_model_runner.py:5721) runs `_dummy_run(max_num_batched_tokens)` and then
`_dummy_sampler_run` on each dummy request's last token, so the peak falls in one of two phases. With N tokens,
R = min(N, max_num_seqs) dummy requests (gpu_model_runner.py `_dummy_run`), K = hidden, V = vocab_size, V' = the
lm_head's padded vocab (V padded to 64, x TP when gathered) and d the activation dtype's bytes:

    forward   the dummy forward's transients (estimate: 4 (N, K) buffers and the larger of the attention
              projections and the MLP intermediates), plus DeepEP's receive tensors, one layer at a time
    sampler   held while the sampler draws its tokens (exact, shapes x dtypes):
                hidden_states (N, K) d        _dummy_run's output, held by profile_run until its `del` (:5793)
                last_hidden_states (R, K) d   hidden_states[logit_indices] (:5553)
                torch.rand_like (R, K) d      _dummy_sampler_run (:5569)
                logits (R, V') d              compute_logits (:5571): lm_head, all-gathered over TP
                                              (model_executor/layers/logits_processor.py:99-103, a view [:, :V])
                logits.to(float32) (R, V)     v1/sample/sampler.py:90 (no copy when d is already 4 bytes)
                probs (R, V) f32              v1/sample/ops/topk_topp_sampler.py:112 forward_native (CUDA's default)
                q (R, V) f32                  topk_topp_sampler.py:334 random_sample's exponential noise
                from R >= 8 (topk_topp_sampler.py:251) the Triton top-k/top-p kernel's per-program buffer
                (P, V) f32, P = min(next_power_of_2(min(SMs, R)), SMs), cached for the process
                (v1/sample/ops/topk_topp_triton.py:1011-1018); under 8, torch.sort's (R, V) f32 values and int64
                indices, its bool masks and the top-p softmax (topk_topp_sampler.py:279-300) before q exists
    both      PyTorch's cuBLAS workspace, allocated through the caching allocator at the first GEMM and kept
              (torch 2.10's aten/src/ATen/cuda/CublasHandlePool.cpp, vLLM 0.19.0's pin: one per stream, cuBLASLt
              sharing it; 32 MiB on compute capability 9.x, 10.x and 12.x, else ':4096:2:16:8' = 8 MiB + 128 KiB)

vLLM 0.30.0's dummy sampler draws twice, the second time seeded, which takes the same native path, so the sampler
phase carries over; other releases are taken to hold the same (labelled so in the plan's sources).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from harness.core.units import next_pow2
from harness.sizing import gpus
from harness.sizing.gpus import Gpu
from harness.sizing.model_config import ModelFacts, pad_vocab

F32 = 4
TRITON_MIN_ROWS = 8  # topk_topp_sampler.py:251: the Triton kernel from 8 rows, torch.sort below
CUBLAS_WORKSPACE_SM90_PLUS = 4096 * 8 * 1024  # CublasHandlePool.cpp: 32 MiB on compute capability 9, 10, 12
CUBLAS_WORKSPACE_BEFORE_SM90 = 4096 * 1024 * 2 + 16 * 1024 * 8  # ':4096:2:16:8'

# What the profile depends on of the GPU: its compute capability's major (the cuBLAS workspace) and its SM count
# (the Triton sampler's programs), from the GPU table (harness.sizing.gpus). A GPU not named is taken as an H100's,
# labelled so.
DEFAULT_GPU_FACTS = (9, 132, "GPU not in the table: an H100's compute capability 9.0 and 132 SMs assumed")


@dataclass(frozen=True)
class Phase:
    """One phase's transient torch bytes and what they are."""

    bytes: int
    detail: str


def gpu_facts(gpu: str | Gpu | None) -> tuple[int, int, str]:
    """(compute capability major, SMs, source) of the GPU the deployment runs on."""
    row = gpus.resolve(gpu)
    if row is None:
        return DEFAULT_GPU_FACTS
    major, minor = row.capability
    return major, row.num_sms, f"{row.name}: compute capability {major}.{minor}, {row.num_sms} SMs"


def cublas_workspace(gpu: str | Gpu | None) -> tuple[int, str]:
    """(bytes, source) of PyTorch's cuBLAS workspace on the main stream (cuBLASLt shares it)."""
    major, _, where = gpu_facts(gpu)
    size = CUBLAS_WORKSPACE_SM90_PLUS if major in (9, 10, 12) else CUBLAS_WORKSPACE_BEFORE_SM90
    return size, (f"estimate: PyTorch's cuBLAS workspace, one per stream through the caching allocator, kept from "
                  f"the first GEMM: {size} B at compute capability {major}.x (torch 2.10's CublasHandlePool.cpp, vLLM "
                  f"0.19.0's pin; {where})")  # fmt: skip


def sampler_phase(facts: ModelFacts, *, num_tokens: int, max_num_seqs: int, tp: int, gpu: str | Gpu | None) -> Phase:
    """What profile_run holds while its dummy sampler draws, beyond the buffers held before it (module docstring):
    hidden (N, K) + 2 (R, K) activations, logits (R, V') in the activation dtype, the f32 (R, V) copies and the
    top-k/top-p kernel's buffer."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    R = min(num_tokens, max_num_seqs)
    V, V_pad = facts.vocab_size, pad_vocab(facts.vocab_size, tp) * tp
    hidden = N * K * d + 2 * R * K * d
    logits = R * V_pad * d
    f32_logits = R * V * F32 if d != F32 else 0
    _, sms, _ = gpu_facts(gpu)
    if R >= TRITON_MIN_ROWS:
        programs = min(sms, R)
        rows = min(next_pow2(programs), sms)
        topk = rows * V * F32
        sampling = 2 * R * V * F32  # probs and q, with the kernel's buffer (cached) still there
        top = f"probs + q 2 x ({R}, {V}) f32 + the Triton top-k/top-p buffer ({rows}, {V}) f32"
        transient = topk + sampling
    else:
        # apply_top_k_top_p_pytorch: sorted values f32 + int64 indices + two bool masks + the top-p softmax f32;
        # these are freed before random_sample's probs + q (2 f32), so the larger of the two counts
        topk = R * V * (F32 + 8 + 1 + 1 + F32)
        sampling = 2 * R * V * F32
        transient = max(topk, sampling)
        top = f"max(torch.sort's path {topk} B, probs + q {sampling} B) at ({R}, {V})"
    total = hidden + logits + f32_logits + transient
    return Phase(total, f"sampler {total} B = hidden (N={N}, {K}) + 2 x (R={R}, {K}) x {d} B + logits ({R}, {V_pad}) "
                        f"x {d} B + {'f32 copy (R, V) + ' if f32_logits else ''}{top}")  # fmt: skip


def mla_workspace_rows(*, max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    """The rows of MLA's chunked-prefill workspace (MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size,
    model_executor/layers/attention/mla_attention.py: 0.19.0:1393, 0.26.0:1688): 8 requests of max_model_len or 4
    pages a request, at most 64Ki tokens, at least a page a request. The block size is the one the backend runs:
    Platform.update_block_size_for_backend sets it after the model loads, before the profile run."""
    rows = min(max(8 * max_model_len, 4 * max_num_seqs * block_size), 64 * 1024)
    return max(rows, max_num_seqs * block_size)


def mla_attention_point(facts: ModelFacts, *, num_tokens: int, tp: int, rows: int, eager: bool) -> Phase:
    """What the dummy forward holds inside an MLA layer's attention call (exact, shapes x dtypes). Without attention
    metadata MLAAttention.forward_impl allocates, to stand for the prefill context's up-projection, a
    (rows, heads, qk_nope + v) tensor it never reads (mla_attention.py 0.19.0:553, 0.26.0:706: `_ = torch.empty(...)`,
    alive until the call returns), beside its inputs and output (layers/mla.py MultiHeadLatentAttentionWrapper.forward):
    q (N, heads x (qk_nope + qk_rope)), kv_c_normed (N, kv_lora_rank), k_pe (N, qk_rope), the output
    (N, heads x v) (MLAAttention.forward: torch.empty(output_shape)) and the residual stream (N, K). Eager, the
    caller's frame also keeps the normed hidden states (N, K) and the latent projections (fused_qkv_a_proj's
    (N, q_lora + kv_lora + qk_rope) and the normed q_c (N, q_lora); without q_lora kv_a_proj_with_mqa's
    (N, kv_lora + qk_rope)), which a compiled graph frees before the attention call."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    heads = facts.num_attention_heads // tp
    nope, rope, v, latent = facts.qk_nope_head_dim, facts.qk_rope_head_dim, facts.v_head_dim, facts.kv_lora_rank
    dummy = rows * heads * (nope + v) * d
    inputs = N * (heads * (nope + rope) + latent + rope + heads * v + K) * d
    held = 0
    if eager:
        q_lora = facts.q_lora_rank or 0
        held = N * (K + (2 * q_lora if q_lora else 0) + latent + rope) * d
    total = dummy + inputs + held
    eager_part = f" + the eager caller's normed hidden states and latent projections {held} B" if eager else ""
    return Phase(total, f"MLA attention {total} B = the profile's stand-in for the prefill up-projection ({rows}, "
                        f"{heads}, {nope + v}) x {d} B + q, kv_c_normed, k_pe, output and residual at N={N} "
                        f"{inputs} B{eager_part}")  # fmt: skip


def moe_call_tensors(facts: ModelFacts, *, num_tokens: int, intermediate: int,
                     act_quant: str | None) -> tuple[int, str]:  # fmt: skip
    """What one modular experts call allocates beside its workspace, live at its quantization of the intermediate
    (the allocator's history of a real 0.26.0 startup: results/h200/load-snapshot): the output
    (fused_moe/modular_kernel.py FusedMoEKernel.apply: `torch.empty_like(hidden_states)`, (N, K)), and with FP8
    activations (`act_quant`: the checkpoint's FP8 scheme) the prepare's quantized input a1q (N, K) fp8
    (prepare_finalize/no_dp_ep.py _quantize_input) and the quantized intermediate a2q (N x topk, I) fp8
    (experts/triton_moe.py TritonExperts.apply: moe_kernel_quantize_input, or silu_and_mul_per_block_quant for
    128 x 128 blocks), with their f32 scales: one per tensor, per token for per-channel weights, per 128 for
    blocks."""
    if not facts.is_moe:
        return 0, ""
    N, K, d, topk = num_tokens, facts.hidden_size, facts.dtype_bytes, facts.top_k
    output = N * K * d
    if act_quant is None:
        return output, f"the experts call's output (N={N}, {K}) x {d} B"
    rows = N * topk
    if act_quant == "fp8-block":
        scales = (N * math.ceil(K / 128) + rows * math.ceil(intermediate / 128)) * 4
    elif act_quant == "fp8-channel":
        scales = (N + rows) * 4
    else:
        scales = 2 * 4
    total = output + N * K + rows * intermediate + scales
    return total, (
        f"the experts call's output (N={N}, {K}) x {d} B + a1q (N, {K}) fp8 + a2q (N x topk {topk}, "
        f"I={intermediate}) fp8 + {scales} B of scales"
    )


def first_moe_call_frames(facts: ModelFacts, *, num_tokens: int, tp: int, compiled: bool) -> Phase:
    """What the first MoE layer's call keeps to the end of the profile run where its frames outlive it
    (release_defaults.first_moe_call_kept): the tensors its finished frames hold, read in two runs of vLLM 0.26.0
    that kept them (the referrers of every large CUDA tensor at a later layer's MLA attention, results/h200/
    startup-gaps). The MoE runner's frames (fused_moe/runner/moe_runner.py _moe_forward_shared with its op call's
    arguments, _forward_impl, _apply_quant_method, and the router's _compute_routing) hold five (N, K) tensors: the
    experts op's inputs and its shared and routed outputs. Compiled, the finished piecewise-backend frame holds the
    MoE layer's piece's arguments too: the attention's output (N, heads / TP x v_head_dim; without MLA head_dim)
    and the residual (N, K). Without a later layer there is nothing for them to add to."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    runner = 5 * N * K * d
    width = (facts.num_attention_heads // tp) * (facts.v_head_dim if facts.is_mla else facts.head_dim)
    piece = N * (width + K) * d if compiled else 0
    part = f" + the compiled piece's attention output (N, {width}) and residual (N, {K}) {piece} B" if piece else ""
    return Phase(runner + piece, f"five (N={N}, {K}) x {d} B of the MoE runner's frames {runner} B{part}")


def layers_after_first_moe(facts: ModelFacts) -> tuple[bool, bool, bool]:
    """Whether a layer of any kind, another MoE layer and a dense layer follow the first MoE layer: the points a
    kept first call adds to."""
    if not facts.moe_layers:
        return False, False, False
    first, moe = min(facts.moe_layers), set(facts.moe_layers)
    dense_after = any(i > first and i not in moe for i in range(facts.num_hidden_layers))
    return first < facts.num_hidden_layers - 1, len(moe) > 1, dense_after


def activation_quant_bytes(facts: ModelFacts, rows: int, width: int) -> int:
    """A W8A8 checkpoint's quantized copy of a linear's (rows, width) input, made while that input is live: 1 B an
    element (int8: compressed-tensors W8A8 int8's ScaledMMLinearKernel, ops.scaled_int8_quant; FP8: the layer's
    QuantFP8) and the dynamic scales, one f32 per token, or one per 128-element group for block FP8 (per-token-group
    quant); none with a static input scale. The MLP's down projection has the widest input: (N, I / TP)."""
    q = facts.quant
    if q is None or not width or not q.scheme.startswith(("int8", "fp8")):
        return 0
    scales = 0 if q.static_input else rows * 4 * (width // q.block[1] if q.block else 1)
    return rows * width + scales


def query_quant_fused(kv_cache_dtype: str, *, compiled: bool) -> bool:
    """Whether the attention layer quantizes the query to fp8 inside the compiled graph (vLLM 0.26.0
    model_executor/layers/attention/attention.py: with an fp8 KV cache and a backend that takes a quantized query,
    `self.query_quant = QuantFP8(static=True, ...)`, applied in forward "with a simple torch operation [that] enables
    torch.compile to fuse this into previous ops"; FlashAttention takes one on every platform but XPU
    (v1/attention/backends/fa_utils.py flash_attn_supports_quant_query_input), Triton attention on CUDA
    (triton_attn.py)). Measured: GLM-4.5 cut to four layers with an fp8 cache peaks 0.09 GiB under the bf16 cache's
    compiled attention block, one (8192, 96 x 128) q-sized output at 1 byte (tests/data/real_startups/
    glm45-4l-kvfp8-seqs128.yaml). Eager, QuantFP8 runs its own kernel after the rotary: no saving. The same
    query_quant is in 0.19.0's and 0.33.0's attention.py."""
    return compiled and kv_cache_dtype in ("fp8", "fp8_e4m3")  # forward asserts these (and nvfp4) for query_quant


# vLLM's aux-stream threshold (envs.py VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD, 256 in 0.19.0-0.30.0; the
# release's own through release_defaults.shared_experts_stream_threshold): above it the shared experts run on the
# main stream before the routed ones (fused_moe/runner/shared_experts.py _determine_shared_experts_order:
# NO_OVERLAP), and their output waits through the routed call.
SHARED_EXPERTS_STREAM_TOKENS = 256


def mla_moe_point(facts: ModelFacts, *, num_tokens: int, tp: int, op_inputs: int, moe_call: int,
                  shared_stream_threshold: int = SHARED_EXPERTS_STREAM_TOKENS) -> Phase:  # fmt: skip
    """What a compiled MLA model holds inside its MoE layer's routed-experts call, beside the MoE workspace and the
    cuBLAS workspace (their own lines). Read from the CUDA caching allocator's history of real vLLM 0.26.0 profile
    runs on the H200 (DeepSeek-V3 and V3.2 cut to four layers with 16 heads, where this point is the torch peak, to
    the byte; results/h200/startup-gaps, seventh batch):

        the piece's arguments, held by its caller   the attention output (N, heads / TP x v_head_dim), the residual
                                                     (N, K)
        the piece's own buffers                      the new residual and `op_inputs` copies of the normed hidden
                                                     states (N, K) each (release_defaults.moe_op_hidden_inputs)
        in the MoE op                                the router logits (N, E) in the gate's dtype
                                                     (models/deepseek_v2.py GateLinear, out_dtype None: the model's
                                                     dtype), the top-k weights f32 and ids int32 (N, top_k); above
                                                     `shared_stream_threshold` the shared experts' output (N, K)
                                                     (their intermediates are freed before the routed call: two
                                                     shared experts peak as one did); the experts call's own tensors
                                                     (`moe_call`, moe_call_tensors)

    The routed call's moe_align_block_size buffers (under 1 MiB at 8192 tokens) are left out. Measured at TP 1; under
    TP the attention output is the rank's heads (an estimate there: the piece then holds the all-reduce's
    buffers)."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    attention = N * (facts.num_attention_heads // tp) * facts.v_head_dim * d
    hidden = (2 + op_inputs) * N * K * d
    logits = N * facts.num_routed_experts * (F32 if facts.router_dtype == "float32" else d)
    topk = N * facts.top_k * (F32 + 4)
    has_shared = bool(facts.num_shared_experts or facts.shared_expert_intermediate_size)
    shared = N * K * d if has_shared and N > shared_stream_threshold else 0
    total = attention + hidden + logits + topk + shared + moe_call
    shared_part = f" + the shared experts' output (N, {K}) {shared} B" if shared else ""
    return Phase(total, f"MoE layer {total} B = the compiled piece's attention output (N={N}, "
                        f"{facts.num_attention_heads // tp} x {facts.v_head_dim}) + {2 + op_inputs} x (N, {K}) x {d} B "
                        f"(the residual in and out, {op_inputs} copies of the op's input) + router logits and top-k "
                        f"{logits + topk} B{shared_part} + the experts call's tensors {moe_call} B")  # fmt: skip


def forward_phase(facts: ModelFacts, *, num_tokens: int, tp: int, dispatch_recv: int = 0,
                  shared_experts: bool = False, mla_rows: int = 0, eager: bool = False,
                  held_workspace: int = 0, moe_call: int = 0, query_fp8: bool = False,
                  kept: int = 0, moe_op_inputs: int = 0,
                  shared_stream_threshold: int = SHARED_EXPERTS_STREAM_TOKENS) -> Phase:  # fmt: skip
    """The dummy forward's transients (estimate): 4 (N, K) activation buffers and the larger of the attention
    projections' outputs and the MLP intermediates (the MoE's live in its workspace, held once: here the router's
    f32 logits and the top-k ids and weights, and with `shared_experts` the shared experts' gate_up and act_fn
    outputs, 3 (N, I_shared / TP), an MLP the experts' call runs beside the routed ones (0.26.0's
    models/qwen2_moe.py: a Qwen2MoeMLP of shared_expert_intermediate_size; models/deepseek_v2.py DeepseekV2MoE: a
    DeepseekV2MLP of moe_intermediate_size x n_shared_experts; both passed to the FusedMoE as shared_experts)), plus
    DeepEP's receive tensors of one layer.

    An MLA model's attention is its exact point (mla_attention_point, `mla_rows` the chunked-prefill workspace's
    rows), and with a persistent MoE workspace (`held_workspace`, made by the first MoE layer's call and kept) the
    dense layers before the first MoE layer peak without it: their point is counted less it. `moe_call`: the experts
    call's own tensors beside its workspace (moe_call_tensors), in the MoE layer's point. `query_fp8`: the attention
    layer quantizes the query to fp8 before the backend (query_quant_fused), so the compiled block's rotary output
    is written as fp8. `kept`: what the first MoE layer's call keeps (first_moe_call_frames), added to the points
    of the layers after it. `moe_op_inputs`: the (N, K) copies the compiled MoE piece hands the MoE op
    (release_defaults.moe_op_hidden_inputs); with it, a compiled MLA model's MoE layer is its exact point
    (mla_moe_point, `shared_stream_threshold` the release's aux-stream threshold)."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    later, later_moe, later_dense = layers_after_first_moe(facts) if kept else (False, False, False)
    if facts.is_mla:
        heads = facts.num_attention_heads // tp
        attn = N * heads * (facts.qk_nope_head_dim * 2 + facts.qk_rope_head_dim + facts.v_head_dim * 2) * d
    else:
        heads, kv = facts.num_attention_heads // tp, max(1, facts.num_key_value_heads // tp)
        attn = N * (2 * heads + 2 * kv) * facts.head_dim * d
    dense_intermediate = facts.intermediate_size // tp if len(facts.moe_layers) < facts.num_hidden_layers else 0
    dense = 3 * N * dense_intermediate * d + activation_quant_bytes(facts, N, dense_intermediate)
    mlp = dense
    routing = shared = 0
    if facts.is_moe:
        routing = N * facts.num_routed_experts * 4 + N * facts.top_k * 12
        if shared_experts:  # the V2 runner's: the shared experts' MLP beside the routed ones
            inter = facts.num_shared_experts * facts.moe_intermediate_size or facts.shared_expert_intermediate_size
            shared = 3 * N * (inter // tp) * d
        mlp = max(mlp, routing + shared + moe_call)
    recv = f" + dispatch receive {dispatch_recv} B" if dispatch_recv else ""
    if facts.is_moe and shared_experts:
        recv = f" (the MLP with the shared experts' gate_up and act_fn outputs){recv}"
    if facts.is_mla and mla_rows:
        point = mla_attention_point(facts, num_tokens=N, tp=tp, rows=mla_rows, eager=eager)
        moe_layers = facts.moe_layers
        dense_first = bool(moe_layers) and all(
            i < min(moe_layers) for i in range(facts.num_hidden_layers) if i not in set(moe_layers)
        )
        dense_point = 4 * N * K * d + dense - (held_workspace if dense_first else 0) + (kept if later_dense else 0)
        moe_point = 4 * N * K * d + routing + shared + moe_call
        moe_detail = f"MoE layer 4 x (N, {K}) + {routing + shared + moe_call} B"
        estimated = "the MLP points estimate"
        if moe_op_inputs and not eager:
            estimated = "the dense MLP point an estimate"
            exact = mla_moe_point(facts, num_tokens=N, tp=tp, op_inputs=moe_op_inputs, moe_call=moe_call,
                                  shared_stream_threshold=shared_stream_threshold)  # fmt: skip
            moe_point, moe_detail = exact.bytes, exact.detail
        moe_point += kept if later_moe else 0
        total = max(point.bytes + (kept if later else 0), dense_point, moe_point) + dispatch_recv
        before = " (before the first MoE layer: less the MoE workspace it has not made yet)" if dense_first and \
            held_workspace else ""  # fmt: skip
        return Phase(total, f"forward {total} B = max({point.detail}; dense MLP 4 x (N={N}, {K}) x {d} B + {dense} B"
                            f"{before}; {moe_detail}){recv} ({estimated})")  # fmt: skip
    total = 4 * N * K * d + max(attn, mlp) + dispatch_recv + (kept if later else 0)
    detail = f"4 x (N={N}, {K}) x {d} B + max(attention {attn} B, MLP {mlp} B){recv} (estimate)"
    if facts.qk_norm == "head" and not eager:
        # The compiled attention block of a model with q/k norms over the head dim (measured: GLM-4.5's peak,
        # results/h200/profile-peak): qkv (N, (H + 2 KV) D), the q norm's, the rotary's and the attention's q-sized
        # outputs (N, H D) each, one k-sized (N, KV D), over the layer's input and the residual (N, K)
        # With an fp8 KV cache the query's quantization is fused into the rotary (query_quant_fused): that
        # q-sized output is fp8, 1 byte an element.
        fp8_q = N * heads * facts.head_dim * (d - 1) if query_fp8 else 0
        block = (
            2 * N * K * d
            + N * (4 * heads + 3 * kv) * facts.head_dim * d
            - fp8_q
            + dispatch_recv
            + (kept if later else 0)
        )
        if block > total:
            total = block
            fused = f" less the rotary's q as fp8 {fp8_q} B (the fp8 KV cache's query quantization)" if fp8_q else ""
            detail = (
                f"the compiled attention block with q/k norms 2 x (N={N}, {K}) x {d} B + qkv, three q-sized "
                f"and one k-sized outputs (N, (4 x {heads} + 3 x {kv}) x {facts.head_dim}) x {d} B{fused}{recv}"
            )
    return Phase(total, f"forward {total} B = {detail}")


# vLLM 0.26.0's V2 model runner (v1/worker/gpu/model_runner.py), the runner release_defaults.v2_runner_without_estimate
# names per architecture. Its profile_run (model_runner.py:673) runs `_dummy_run(max_num_tokens, skip_attn=True,
# is_profile=True)`: the forward without attention metadata (execute_model: `skip_attn_for_dummy_run`, the backends'
# `attn_metadata is None` branch fills the output with zeros, v1/attention/backends/flash_attn.py:847), eager
# (dispatch_cg_and_sync_dp(need_eager=is_profile)), and then `_dummy_sampler_run` (model_runner.py:654) on
# hidden_states[logits_indices]. Its request states, input buffers and sampler states are made in __init__ and
# load_model, before the profiler's first snapshot, so they are outside the torch peak.
#
# The decoder layers whose eager forward is read here, and whether their MLP keeps gate_up through down_proj:
#   models/llama.py LlamaMLP.forward: `x, _ = gate_up_proj(x); x = act_fn(x)`: gate_up freed before down_proj
#   models/qwen2.py Qwen2MLP.forward (qwen3.py imports it as Qwen3MLP): `gate_up, _ = ...; x = act_fn(gate_up)`:
#     gate_up held until the MLP returns
V2_EAGER_LAYERS: dict[str, tuple[bool, str]] = {
    "LlamaForCausalLM": (False, "models/llama.py LlamaMLP.forward (gate_up freed before down_proj)"),
    "Qwen2ForCausalLM": (True, "models/qwen2.py Qwen2MLP.forward (gate_up held through down_proj)"),
    "Qwen3ForCausalLM": (True, "models/qwen2.py Qwen2MLP.forward as Qwen3MLP (gate_up held through down_proj)"),
}
GUMBEL_BLOCK = 1024  # v1/worker/gpu/sample/gumbel.py gumbel_sample: BLOCK_SIZE


def v2_sampler_phase(facts: ModelFacts, *, num_tokens: int, max_num_seqs: int, tp: int) -> Phase:
    """What the V2 runner's profile_run holds while its dummy sampler runs (exact, shapes x dtypes):

        hidden_states (N, K) d           _dummy_run's output, held by profile_run until its `del`
        sample_hidden_states (R, K) d    hidden_states[input_batch.logits_indices] (_dummy_run's return)
        logits (R, V') d                 model.compute_logits: lm_head, all-gathered over TP (a view [:, :V])
        pos int64, input_ids int32 (R)   Sampler.__call__: input_batch.positions / input_ids [logits_indices]
        local_argmax int64, local_max    gumbel_sample (v1/worker/gpu/sample/gumbel.py): (R, ceil(V / 1024)) each
          f32 (R, ceil(V / 1024))

    The dummy requests keep the sampling states' initial values (v1/worker/gpu/sample/states.py: temperature 0,
    top_k = V, top_p 1, min_p 0), so temperature, min_p and top-k/top-p are skipped (no f32 copy, no sort) and no
    logprobs are asked (no clone); the logit bias, penalties and bad words act in place."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    R = min(num_tokens, max_num_seqs)
    V, V_pad = facts.vocab_size, pad_vocab(facts.vocab_size, tp) * tp
    blocks = -(-V // GUMBEL_BLOCK)
    hidden = N * K * d + R * K * d
    logits = R * V_pad * d
    small = R * (8 + 4) + R * blocks * (8 + F32)
    total = hidden + logits + small
    detail = (f"V2 sampler {total} B = hidden (N={N}, {K}) + (R={R}, {K}) x {d} B + logits ({R}, {V_pad}) x {d} B + "
              f"positions, input ids and gumbel_sample's ({R}, {blocks}) int64 + f32 (v1/worker/gpu/model_runner.py "
              "_dummy_sampler_run, v1/worker/gpu/sample/sampler.py)")  # fmt: skip
    return Phase(total, detail)


def v2_eager_forward_phase(facts: ModelFacts, *, num_tokens: int, tp: int) -> Phase | None:
    """The V2 runner's dummy forward without torch.compile (--enforce-eager), for the decoder layers of
    V2_EAGER_LAYERS in the model dtype (no quantized GEMM inputs); None for any other model.

    Eager, vLLM's own kernels run (platforms/cuda.py get_default_ir_op_priority: vllm_c before native when not
    compiling): fused_add_rms_norm writes hidden_states and residual in place (ir/ops/layernorm.py, allow_inplace)
    and the rotary embedding rotates q and k in place (rotary_embedding/base.py forward_cuda). The model's layer loop
    (llama.py LlamaModel.forward, qwen2.py Qwen2Model.forward: `hidden_states, residual = layer(positions,
    hidden_states, residual)`) holds the previous layer's output while the next layer runs, so from the second layer
    on three (N, K) tensors are held through the MLP: that output (normalized in place as the layer's input), the
    residual and the attention block's output (normalized in place as the MLP's input). With I = intermediate / TP,
    D the head dim and H, KV the heads per rank, the larger of:

        MLP         gate_up (N, 2I) + act_fn's (N, I); at down_proj act_fn's (N, I) + its output (N, K) (a second
                    (N, K) for the all-reduce's output under TP), + gate_up where the MLP still holds it
        attention   qkv_proj's (N, (H + 2 KV) D), the q/k norms' outputs (N, (H + KV) D) where the model has them,
                    the attention output (N, H D) (attention.py Attention.forward: torch.empty) and o_proj's (N, K)
                    (two under TP), over the layer's input and the residual"""
    known = V2_EAGER_LAYERS.get(facts.architecture)
    if known is None or facts.is_moe or facts.is_mla or facts.quant is not None:
        return None
    keeps_gate_up, mlp_source = known
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    inter = facts.intermediate_size // tp
    heads, kv = facts.num_attention_heads // tp, max(1, facts.num_key_value_heads // tp)
    reduced = N * K * d * (2 if tp > 1 else 1)  # RowParallelLinear's output, and the all-reduce's under TP
    held = (3 if facts.num_hidden_layers >= 2 else 2) * N * K * d
    gate_up, act = N * 2 * inter * d, N * inter * d
    mlp = gate_up + act + reduced if keeps_gate_up else max(gate_up + act, act + reduced)
    qk_norm = N * (heads + kv) * facts.head_dim * d if facts.qk_norm == "head" else 0
    qkv, attn_out = N * (heads + 2 * kv) * facts.head_dim * d, N * heads * facts.head_dim * d
    attn = 2 * N * K * d + qkv + qk_norm + attn_out + reduced
    total = max(held + mlp, attn)
    return Phase(total, f"eager forward {total} B = max({held // (N * K * d)} x (N={N}, {K}) x {d} B held + MLP {mlp} "
                        f"B, attention {attn} B with the layer's input and residual) ({mlp_source}; "
                        "v1/worker/gpu/model_runner.py profile_run, skip_attn)")  # fmt: skip


# The first compile. Where the model is torch.compile'd (not --enforce-eager), its first forward is the profile's
# dummy run, so Inductor compiles inside profile_run and what it allocates to tune its Triton kernels counts in the
# torch peak; a warm compile cache (a later startup of the same model and flags) skips it. Measured with the CUDA
# caching allocator's history on one H200 under vLLM 0.26.0 and torch 2.11 (results/h200/profile-peak: 16 cold and
# warm startups, the trace's peak vLLM's figure to the byte on 15): on a cold cache the peak was one of three
# points on 13 of the 14 cold ones (GLM-4.5's: its compiled attention block after the first MoE layer, forward_phase):
#   1. the compile-time autotune block (torch/_inductor/codegen/wrapper.py generate_and_run_autotune_block) makes
#      random example arguments for each generated kernel (select_algorithm.py generate_example_value ->
#      torch/_dynamo/testing.py rand_strided) at the token count's size hint, N; the largest is the kernel that
#      gathers the embedding rows and normalizes them for the first layer, whose arguments are a copy of the
#      embedding table (V' / TP, K), its two (N, K) outputs (the residual and the normed input), the token ids
#      (N) int32 and the norm's weight (K). Nothing else is allocated yet (no GEMM has run: no cuBLAS workspace).
#   2. the combo kernel's benchmark: vLLM sets Inductor's combo_kernels and benchmark_combo_kernel
#      (config/compilation.py CompilationConfig.__post_init__, release_defaults.benchmarks_combo_kernels), and the
#      horizontally fused rotary kernel of q and k is benchmarked on random copies of its arguments
#      (codegen/triton.py benchmark_combo_kernel: mod.get_args()): the rope cache (positions, rotary dim), the qkv
#      projection (N, (H + 2 KV) D), q (N, H D) and k (N, KV D) (twice each where q/k norms or a partial rotary
#      fuse in), the positions (N) int64 and the benchmarker's L2 flush buffer.
#   3. the forward's first run, where each Triton kernel not yet tuned is benchmarked on its live arguments
#      (runtime/triton_heuristics.py autotune_to_one_config), with the benchmarker's buffer that flushes the L2
#      cache (runtime/benchmarking.py benchmark_gpu: torch.empty(L2_cache_size // 4, dtype=torch.int)) beside
#      what the forward holds.
L2_CACHE_BYTES = {"H200": (60 * 1024 * 1024, "measured: torch's benchmarker allocated 62914560 B on the H200"),
                  "H100": (50 * 1024 * 1024, "NVIDIA's H100 datasheet: 50 MB L2")}  # fmt: skip
L2_DEFAULT = (60 * 1024 * 1024, "the H200's measured 60 MiB taken (this GPU's L2 is not in the table)")
TOKEN_IDS_BYTES = 4  # int32 input ids (InputBatch.input_ids)
POSITIONS_BYTES = 8  # int64 positions


def l2_cache(gpu: str | Gpu | None) -> tuple[int, str]:
    """(bytes, source) of the buffer Inductor's benchmarker allocates to flush the L2 cache: its size."""
    row = gpus.resolve(gpu)
    name = row.name if row is not None else ""
    for prefix, value in L2_CACHE_BYTES.items():
        if name.startswith(prefix):
            return value
    return L2_DEFAULT


def compile_phase(facts: ModelFacts, *, num_tokens: int, tp: int, gpu: str | Gpu | None, first_rank: bool,
                  combo: bool, rope_cache: int) -> Phase:  # fmt: skip
    """The first compile's largest tuning point (points 1 and 2 above; exact, shapes x dtypes): the embedding
    kernel's example arguments on the first pipeline rank, and with `combo` the rotary combo kernel's benchmark
    (`rope_cache` the rope cache's bytes). Neither holds the cuBLAS workspace (no GEMM has run)."""
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    rows = pad_vocab(facts.vocab_size, tp)
    embed = rows * K * d + 2 * N * K * d + N * TOKEN_IDS_BYTES + K * d if first_rank else 0
    rope, again = 0, False
    l2, _ = l2_cache(gpu)
    if combo and not facts.is_mla:
        heads, kv, D = facts.num_attention_heads // tp, max(1, facts.num_key_value_heads // tp), facts.head_dim
        again = facts.qk_norm == "head" or 0 < facts.rotary_dim < D
        qk = N * (heads + kv) * D * d * (2 if again else 1)
        rope = rope_cache + N * (heads + 2 * kv) * D * d + qk + N * POSITIONS_BYTES + l2
    total = max(embed, rope)
    parts = []
    if embed:
        parts.append(f"the embedding kernel's example arguments {embed} B (a copy of the table ({rows}, {K}), 2 x "
                     f"(N={N}, {K}) outputs x {d} B, the ids and the norm's weight)")  # fmt: skip
    if rope:
        parts.append(f"the rotary combo kernel's benchmark {rope} B (the rope cache {rope_cache} B, qkv, q and k"
                     f"{' twice' if again else ''} at N={N}, the positions and the {l2} B L2 flush)")  # fmt: skip
    measured = "measured on the H200 at TP 1" + ("; per rank under TP: an estimate" if tp > 1 else "")
    return Phase(total, f"first compile {total} B = max({'; '.join(parts) or 'nothing'}) (Inductor's tuning inside "
                        f"profile_run on a cold compile cache, {measured}: results/h200/profile-peak)")  # fmt: skip


def v2_compiled_forward_phase(facts: ModelFacts, *, num_tokens: int, tp: int, gpu: str | Gpu | None,
                              cublas: int) -> Phase | None:  # fmt: skip
    """The V2 runner's compiled forward of a dense model (point 3 above): Inductor's generated code holds three
    (N, K) tensors (the residual, the layer's input and the attention block's output) through the MLP, whose
    gate_up (N, 2I) and activation (N, I) outputs (fc1's (N, I) and the activation's for an ungated MLP) are live
    while the activation kernel is first tuned, beside the L2 flush buffer and the cuBLAS workspace (counted on
    its own line, so less it here). Measured on the H200 (results/h200/profile-peak: Llama, Qwen3, Gemma 2/3,
    Phi-2, float32 and 32768 tokens); None for an MoE or MLA model."""
    if facts.is_moe or facts.is_mla:
        return None
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    inter = facts.intermediate_size // tp
    mlp = (3 if facts.mlp_gated else 2) * N * inter * d
    l2, l2_source = l2_cache(gpu)
    total = 3 * N * K * d + mlp + l2
    kind = "gate_up (N, 2I) + act (N, I)" if facts.mlp_gated else "fc1 (N, I) + act (N, I)"
    return Phase(total, f"compiled forward {total} B = 3 x (N={N}, {K}) x {d} B + {kind} at I={inter} {mlp} B + "
                        f"the first run's L2 flush {l2} B ({l2_source}) (Inductor's code, measured on the H200: "
                        f"results/h200/profile-peak; {'exact' if tp == 1 and facts.quant is None else 'estimate'}; "
                        f"the cuBLAS workspace, {cublas} B, on its own line)")  # fmt: skip


# The V1 runner's compiled Qwen3-Next (models/qwen3_next.py: Qwen3NextGatedDeltaNet with gqa_interleaved_layout=True).
# The gated delta net's core is a splitting op (qwen_gdn_linear_attn.py forward_cuda:
# torch.ops.vllm.qwen_gdn_attention_core(mixed_qkv, b, a, core_attn_out)), so a piece graph runs one linear layer's
# tail (RMSNormGated over core_attn_out and z, out_proj, the MoE) and the next linear layer's head (the input norm,
# in_proj_qkvz, in_proj_ba, the interleaved layout unpacked and concatenated, core_attn_out = torch.zeros). Measured
# with the CUDA caching allocator's history on one H200 (vLLM 0.26.0, torch 2.11, results/h200/startup-gaps: the
# trace's peak is vLLM's torch peak to 0.01 GiB), the profile's peak is in the first such piece, while its kernel
# after the head's tensors is first tuned (runtime/triton_heuristics.py autotune_to_one_config, point 3 above): the
# earlier piece's z, core_attn_out and residual, still held by the split graph's caller, and this piece's own.
GDN_INTERLEAVED = {"Qwen3NextForCausalLM": "models/qwen3_next.py Qwen3NextGatedDeltaNet(gqa_interleaved_layout=True)"}


def gdn_compiled_point(facts: ModelFacts, *, num_tokens: int, tp: int, gpu: str | Gpu | None) -> Phase | None:
    """The compiled piece that joins two gated-delta-net layers (above; exact at TP 1, measured), with
    KD = key heads x key dim / TP, VD = value heads x value dim / TP, NV = value heads / TP:

        held from the piece before   z (N, VD), core_attn_out (N, VD), the residual (N, K)
        this piece's                 z (N, VD), core_attn_out (N, VD), the residual (N, K), in_proj_qkvz's
                                     (N, 2 KD + 2 VD), in_proj_ba's (N, 2 NV), the concatenated mixed_qkv
                                     (N, 2 KD + VD), b and a (N, NV) each
        the first run's L2 flush     (Inductor's benchmarker)

    None for another model, or without two linear layers in a row. The MoE workspace (made by the tail's experts
    call) and the cuBLAS workspace are live too and counted on their own lines."""
    where = GDN_INTERLEAVED.get(facts.architecture)
    kinds = facts.kinds
    if where is None or not any(a == b == "linear" for a, b in itertools.pairwise(kinds)):
        return None
    N, K, d = num_tokens, facts.hidden_size, facts.dtype_bytes
    kd = facts.linear_num_key_heads * facts.linear_key_head_dim // tp
    vd = facts.linear_num_value_heads * facts.linear_value_head_dim // tp
    nv = facts.linear_num_value_heads // tp
    tensors = N * (2 * K + 4 * vd + (2 * kd + 2 * vd) + 2 * nv + (2 * kd + vd) + 2 * nv) * d
    l2, l2_source = l2_cache(gpu)
    total = tensors + l2
    return Phase(total, f"the compiled piece joining two gated-delta-net layers {total} B = 2 x (z (N={N}, {vd}), "
                        f"core_attn_out (N, {vd}), residual (N, {K})) + in_proj_qkvz (N, {2 * kd + 2 * vd}) + "
                        f"in_proj_ba (N, {2 * nv}) + mixed_qkv (N, {2 * kd + vd}) + b, a (N, {nv}) x {d} B + the "
                        f"first run's L2 flush {l2} B ({l2_source}) ({where}; qwen_gdn_linear_attn.py forward_cuda; "
                        "measured on the H200: results/h200/startup-gaps; "
                        f"{'exact' if tp == 1 else 'an estimate per rank under TP'})")  # fmt: skip
