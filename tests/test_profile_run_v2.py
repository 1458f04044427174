"""vLLM 0.26.0's V2 model runner's profile run (harness.sizing.profile_run: v2_eager_forward_phase,
v2_sampler_phase) against hand computations from the release's code for one small config, and the plan's use of
them: only where the release runs the architecture on its V2 runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sizing.model_config import ModelFacts
from harness.sizing.profile_run import v2_eager_forward_phase, v2_sampler_phase
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


@pytest.mark.parametrize("name", ["llama-8b-4l", "qwen3-8b-4l"])
def test_the_compiled_forward_is_labelled_an_estimate(name, tmp_path):
    plan = plan_record(load_record(STARTUPS / f"{name}.yaml"), cache_dir=tmp_path)
    line = next(line for line in plan.lines if line.name == "activations")
    assert line.kind == "estimate" and "compiled (torch.compile) forward of this model is not read" in line.source


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
