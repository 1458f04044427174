"""vLLM 0.26.0's V2 model runner's profile run (harness.sizing.profile_run: v2_eager_forward_phase,
v2_compiled_forward_phase, v2_sampler_phase) and the first compile's tuning (compile_phase) against hand
computations from the release's code for one small config, and the plan's use of them: only where the release runs
the architecture on its V2 runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sizing.model_config import ModelFacts
from harness.sizing.profile_run import (
    compile_phase,
    v2_compiled_forward_phase,
    v2_eager_forward_phase,
    v2_sampler_phase,
)
from harness.verify.planning import plan_record, record_facts
from harness.verify.record import load_record

STARTUPS = Path(__file__).resolve().parent / "data" / "real_startups"


def _facts(architecture: str = "LlamaForCausalLM", **update) -> ModelFacts:
    """A two-layer model: K = 256, I = 1024, 8 query heads and 2 KV heads of 32, vocab 1000, bfloat16."""
    base = dict(name="small", path="test", architecture=architecture, hidden_size=256, num_hidden_layers=2,
                vocab_size=1000, tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=2,
                head_dim=32, intermediate_size=1024, dtype="bfloat16")  # fmt: skip
    base.update(update)
    return ModelFacts(**base)  # type: ignore[arg-type]


def test_llama_eager_forward_by_hand():
    # N = 64 tokens, bf16 (2 B). From the second layer on, LlamaModel.forward's loop holds the previous layer's
    # output (normalized in place by the vllm_c fused_add_rms_norm), the residual and the attention block's output:
    held = 3 * 64 * 256 * 2
    # LlamaMLP.forward: gate_up_proj's (64, 2048), then act_fn's (64, 1024) while gate_up is still alive; `x` is
    # reassigned, so gate_up is freed before down_proj writes its (64, 256)
    gate_up, act, down = 64 * 2048 * 2, 64 * 1024 * 2, 64 * 256 * 2
    mlp = max(gate_up + act, act + down)
    # the attention block (attention skipped): qkv_proj (64, (8 + 2 x 2) x 32), Attention.forward's torch.empty
    # output (64, 8 x 32), o_proj (64, 256), over the layer's input and the residual
    attention = 2 * 64 * 256 * 2 + 64 * 12 * 32 * 2 + 64 * 8 * 32 * 2 + 64 * 256 * 2
    phase = v2_eager_forward_phase(_facts(), num_tokens=64, tp=1)
    assert phase is not None
    assert phase.bytes == max(held + mlp, attention) == 491520


def test_qwen2_mlp_holds_gate_up_through_down_proj():
    # Qwen2MLP.forward keeps `gate_up` while down_proj runs: gate_up + act + down's output
    phase = v2_eager_forward_phase(_facts("Qwen2ForCausalLM"), num_tokens=64, tp=1)
    assert phase is not None
    assert phase.bytes == 3 * 64 * 256 * 2 + 64 * 2048 * 2 + 64 * 1024 * 2 + 64 * 256 * 2 == 524288


def test_tensor_parallel_eager_forward_by_hand():
    # TP 2: I = 512, 4 query heads and 1 KV head per rank; RowParallelLinear's output and the all-reduce's
    held = 3 * 64 * 256 * 2
    mlp = max(64 * 1024 * 2 + 64 * 512 * 2, 64 * 512 * 2 + 2 * 64 * 256 * 2)
    attention = 2 * 64 * 256 * 2 + 64 * 6 * 32 * 2 + 64 * 4 * 32 * 2 + 2 * 64 * 256 * 2
    phase = v2_eager_forward_phase(_facts(), num_tokens=64, tp=2)
    assert phase is not None
    assert phase.bytes == max(held + mlp, attention) == 294912


def test_eager_forward_is_not_claimed_for_other_layers():
    assert v2_eager_forward_phase(_facts("GemmaForCausalLM"), num_tokens=64, tp=1) is None
    assert v2_eager_forward_phase(_facts(moe_layers=(0, 1), num_routed_experts=8, top_k=2,
                                         moe_intermediate_size=512), num_tokens=64, tp=1) is None  # fmt: skip


def test_v2_sampler_by_hand():
    # N = 64, R = min(64, max_num_seqs 16) = 16: profile_run holds hidden_states (64, 256) and _dummy_run's
    # hidden_states[logits_indices] (16, 256); compute_logits (16, 1024) (the vocab padded to 64); Sampler.__call__'s
    # positions int64 and input ids int32 (16); gumbel_sample's local_argmax int64 + local_max f32 (16, ceil(1000 /
    # 1024) = 1). No f32 copy of the logits, no sort: the dummy requests' temperature is 0 and top-k/top-p unset.
    expected = 64 * 256 * 2 + 16 * 256 * 2 + 16 * 1024 * 2 + 16 * (8 + 4) + 16 * 1 * (8 + 4)
    assert v2_sampler_phase(_facts(), num_tokens=64, max_num_seqs=16, tp=1).bytes == expected == 74112


def _activations(plan) -> int:
    return next(line.bytes for line in plan.lines if line.name == "activations")


def test_the_plan_takes_the_v2_terms_for_the_v2_runner(tmp_path):
    """The eager Llama startup (0.26.0, V2 runner): the activations line is the eager forward's; the same record
    read as 0.19.0 (V1 runner) keeps 0.19.0's profile_run."""
    case = load_record(STARTUPS / "llama-8b-4l-eager.yaml")
    facts = record_facts(case)
    n = case.settings.max_num_batched_tokens
    assert n is not None
    v2 = plan_record(case, cache_dir=tmp_path)
    phase = v2_eager_forward_phase(facts, num_tokens=n, tp=1)
    assert phase is not None and _activations(v2) == phase.bytes
    line = next(line for line in v2.lines if line.name == "activations")
    assert line.kind == "exact" and "V2 runner" in line.source
    v1 = plan_record(case.model_copy(update={"vllm_version": "0.19.0"}), cache_dir=tmp_path)
    line = next(line for line in v1.lines if line.name == "activations")
    assert "0.19.0's profile_run" in line.source and _activations(v1) != phase.bytes


def test_first_compile_by_hand():
    """The first compile's tuning points (profile_run.compile_phase) for the small model at N = 64 on an H200: the
    embedding kernel's example arguments (a copy of the (1024, 256) table, the vocab padded to 64; its two (64, 256)
    outputs; the int32 ids and the norm's weight), and the rotary combo kernel's benchmark (the rope cache, qkv
    (64, (8 + 2 x 2) x 32), q (64, 8 x 32), k (64, 2 x 32), the int64 positions and the 60 MiB L2 flush)."""
    embed = 1024 * 256 * 2 + 2 * 64 * 256 * 2 + 64 * 4 + 256 * 2
    rope = 4096 + 64 * 12 * 32 * 2 + 64 * 10 * 32 * 2 + 64 * 8 + 60 * 2**20
    facts = _facts()
    assert compile_phase(facts, num_tokens=64, tp=1, gpu="H200-141GB", first_rank=True, combo=False,
                         rope_cache=4096).bytes == embed == 590592  # fmt: skip
    assert compile_phase(facts, num_tokens=64, tp=1, gpu="H200-141GB", first_rank=True, combo=True,
                         rope_cache=4096).bytes == max(embed, rope) == rope  # fmt: skip
    # a later pipeline rank holds no embedding; q/k norms fuse into the combo kernel: q and k twice
    normed = compile_phase(_facts(qk_norm="head"), num_tokens=64, tp=1, gpu="H200-141GB", first_rank=False,
                           combo=True, rope_cache=4096)  # fmt: skip
    assert normed.bytes == rope + 64 * 10 * 32 * 2


def test_v2_compiled_forward_by_hand():
    # three (64, 256) held, gate_up (64, 2048) + act (64, 1024), the first run's L2 flush (H200: 60 MiB)
    phase = v2_compiled_forward_phase(_facts(), num_tokens=64, tp=1, gpu="H200-141GB", cublas=0)
    assert phase is not None and phase.bytes == 3 * 64 * 256 * 2 + 3 * 64 * 1024 * 2 + 60 * 2**20
    # Phi-2's ungated MLP: fc1 (64, 1024) and its activation
    ungated = v2_compiled_forward_phase(_facts(mlp_gated=False), num_tokens=64, tp=1, gpu="H200-141GB", cublas=0)
    assert ungated is not None and ungated.bytes == 3 * 64 * 256 * 2 + 2 * 64 * 1024 * 2 + 60 * 2**20
    assert v2_compiled_forward_phase(_facts(moe_layers=(0, 1), num_routed_experts=8, top_k=2,
                                            moe_intermediate_size=512), num_tokens=64, tp=1, gpu=None,
                                     cublas=0) is None  # fmt: skip


@pytest.mark.parametrize(("name", "logged_mib"), [("llama-8b-4l", 1130.04), ("qwen3-8b-4l", 1315.04),
                                                  ("gemma2-9b-4l", 1862.04)])  # fmt: skip
def test_the_first_compile_is_the_cold_peak(name, logged_mib, tmp_path):
    """On a cold compile cache these startups peak in Inductor's compile-time autotune block, on the embedding
    kernel's example arguments (results/h200/profile-peak: the allocator's history, live at the peak): the plan's
    profile lines add up to it within 1 MiB."""
    plan = plan_record(load_record(STARTUPS / f"{name}.yaml"), cache_dir=tmp_path)
    line = next(line for line in plan.lines if line.name == "activations")
    assert line.kind == "exact" and line.source.startswith("peak in the first compile")
    peak = sum(line.bytes for line in plan.lines if line.group in ("held-once", "profile-peak"))
    assert abs(peak / 2**20 - logged_mib) < 1


def test_v2_forward_estimate_counts_the_shared_experts():
    """A Qwen2-MoE layer on the V2 runner: the forward estimate's MLP term is the router's f32 logits and top-k ids
    and weights plus the shared expert's gate_up (N, 2 x 512) and act_fn (N, 512) outputs in bf16; the V1 runner's
    estimate (0.19.0, kept as it was) counts the routing only."""
    from harness.sizing.profile_run import forward_phase

    facts = _facts("Qwen2MoeForCausalLM", intermediate_size=0, moe_layers=(0, 1), num_routed_experts=8, top_k=2,
                   moe_intermediate_size=128, shared_expert_intermediate_size=512)  # fmt: skip
    routing = 64 * 8 * 4 + 64 * 2 * 12
    shared = 3 * 64 * 512 * 2
    attention = 64 * (2 * 8 + 2 * 2) * 32 * 2
    v2 = forward_phase(facts, num_tokens=64, tp=1, shared_experts=True)
    assert v2.bytes == 4 * 64 * 256 * 2 + max(attention, routing + shared) == 131072 + 200192
    assert forward_phase(facts, num_tokens=64, tp=1).bytes == 4 * 64 * 256 * 2 + max(attention, routing)
