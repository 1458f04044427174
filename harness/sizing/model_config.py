"""A model's config facts, read from its config.json (a local model directory, as `vllm serve DIR` takes one) or
from a preset shipped in harness/defaults/models/ (the public config facts of the model it names: no weights, no
download). Only what sizes memory is kept; each value remembers the line of config.json it came from.

    architectures          which vLLM model class builds the layers (DeepseekV3, Qwen3Moe, Mixtral, Llama, ...)
    hidden_size, num_hidden_layers, vocab_size, tie_word_embeddings
    attention              GQA: num_attention_heads, num_key_value_heads, head_dim
                           MLA: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    MLP / MoE              intermediate_size (dense), moe_intermediate_size, routed experts (n_routed_experts,
                           num_experts or num_local_experts), num_experts_per_tok, shared experts, which layers are
                           MoE (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers)
    quantization_config    fp8 with a weight block size, or none (the torch_dtype)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.scenario.limits import shown_text

MODELS_DIR = Path(__file__).resolve().parents[1] / "defaults" / "models"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; a bigger file is not one

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "half": 2, "float": 4}
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM")
MOE_ARCHITECTURES = (*MLA_ARCHITECTURES, "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM")
DENSE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
ARCHITECTURES = (*MOE_ARCHITECTURES, *DENSE_ARCHITECTURES)


class ModelConfigError(Exception):
    """A model that cannot be read or is not one this model sizes; the message is one line."""


@dataclass(frozen=True)
class ModelFacts:
    name: str
    path: str  # the config.json read, for sources
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP
    dtype: str
    max_position_embeddings: int | None = None
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    moe_intermediate_size: int = 0
    num_routed_experts: int = 0
    top_k: int = 0
    num_shared_experts: int = 0  # DeepSeek: n_shared_experts MLPs of moe_intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE
    moe_layers: tuple[int, ...] = ()
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of q and k
    weight_block_size: tuple[int, int] | None = None  # fp8 block quantization
    quant_method: str | None = None
    lines: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def is_mla(self) -> bool:
        return self.architecture in MLA_ARCHITECTURES

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def ref(self, *keys: str) -> str:
        """'config.json:12' for the first key that has a line (the preset's file name for presets)."""
        for key in keys:
            if key in self.lines:
                return f"{self.path}:{self.lines[key]}"
        return self.path


def preset_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(model: str) -> ModelFacts:
    """A local directory holding config.json, a config.json file, or a preset name."""
    path = Path(model)
    if len(model) > 4096 or "\0" in model:
        raise ModelConfigError(f"model {model[:60]!r}...: not a usable path")
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelConfigError(f"model {shown_text(model)}: the directory has no config.json (vllm serve reads it "
                                   "from there)")
        return parse_config(config, name=shown_text(path.name))  # a name printed as it is: escaped once, here
    if path.is_file() and path.suffix == ".json":
        return parse_config(path, name=shown_text(path.parent.name or path.stem))
    preset = MODELS_DIR / f"{model.lower()}.json"
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", model.lower()) and preset.is_file():
        return parse_config(preset, name=model.lower(), shown=f"harness/defaults/models/{preset.name}")
    raise ModelConfigError(f"model {shown_text(model)}: not a directory with config.json nor a preset; presets: "
                           f"{', '.join(preset_names())}")  # fmt: skip


def _key_lines(text: str) -> dict[str, int]:
    """Line of the first occurrence of each top-level-looking key (`"name":`), for file:line sources."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', line):
            lines.setdefault(match.group(1), number)
    return lines


def parse_config(path: Path, *, name: str, shown: str | None = None) -> ModelFacts:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelConfigError(f"{path}: {path.stat().st_size} bytes is not a config.json (at most 1 MiB)")
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ModelConfigError(f"{path}: not a readable JSON config: {str(error)[:120]}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: a config.json is a JSON object")
    if isinstance(data.get("text_config"), dict) and "hidden_size" not in data:
        data = {**data["text_config"], "architectures": data.get("architectures", [])}
    return facts_from(data, name=name, path=shown or str(path), lines=_key_lines(text))


def _int(data: dict, key: str, default: int | None = None, *, where: str) -> int:
    value = data.get(key, default)
    if value is None and default is None:
        raise ModelConfigError(f"{where}: {key} is missing; a config.json of this architecture has it")
    if type(value) is not int or not 0 <= value <= 10**7:
        raise ModelConfigError(f"{where}: {key} = {str(value)[:40]} is not an integer in 0..1e7")
    return value


def facts_from(data: dict, *, name: str, path: str, lines: dict[str, int] | None = None) -> ModelFacts:
    archs = data.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None) if isinstance(archs, list) else None
    if arch is None:
        raise ModelConfigError(f"{path}: architectures {str(archs)[:80]} is not one this model sizes; allowed: "
                               f"{', '.join(ARCHITECTURES)}")  # fmt: skip
    def get(key: str, default: int | None = None) -> int:
        return _int(data, key, default, where=path)

    hidden, layers, heads = get("hidden_size"), get("num_hidden_layers"), get("num_attention_heads")
    dtype = str(data.get("torch_dtype") or data.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ModelConfigError(f"{path}: torch_dtype {dtype[:30]!r}; allowed: {', '.join(DTYPE_BYTES)}")
    facts: dict = dict(
        name=name, path=path, architecture=arch, hidden_size=hidden, num_hidden_layers=layers,
        vocab_size=get("vocab_size"), tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        num_attention_heads=heads, num_key_value_heads=get("num_key_value_heads", heads),
        head_dim=get("head_dim", 0) or hidden // heads, intermediate_size=get("intermediate_size", 0), dtype=dtype,
        max_position_embeddings=data.get("max_position_embeddings") if type(data.get("max_position_embeddings")) is int else None,
        lines=lines or {},
    )  # fmt: skip
    if arch in MLA_ARCHITECTURES:
        q_lora = data.get("q_lora_rank")
        facts.update(q_lora_rank=q_lora if type(q_lora) is int else None, kv_lora_rank=get("kv_lora_rank"),
                     qk_nope_head_dim=get("qk_nope_head_dim"), qk_rope_head_dim=get("qk_rope_head_dim"),
                     v_head_dim=get("v_head_dim"))  # fmt: skip
    if arch in MOE_ARCHITECTURES:
        experts = data.get("n_routed_experts", data.get("num_experts", data.get("num_local_experts")))
        facts.update(num_routed_experts=_int({"experts": experts}, "experts", where=path), top_k=get("num_experts_per_tok"),
                     moe_intermediate_size=get("moe_intermediate_size", facts["intermediate_size"]),
                     moe_layers=_moe_layers(data, layers, arch, path))  # fmt: skip
        if arch in MLA_ARCHITECTURES:
            facts["num_shared_experts"] = get("n_shared_experts", 0)
        if arch == "Qwen2MoeForCausalLM":
            facts["shared_expert_intermediate_size"] = get("shared_expert_intermediate_size", 0)
    facts["attention_bias"] = arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") or bool(data.get("attention_bias"))
    facts["qk_norm"] = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    quant = data.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", ""))[:40]
        if method != "fp8":
            raise ModelConfigError(f"{path}: quantization_config.quant_method {method!r} is not one this model sizes; "
                                   "allowed: fp8 (or no quantization_config)")  # fmt: skip
        block = quant.get("weight_block_size")
        facts["quant_method"] = "fp8"
        if isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block):
            facts["weight_block_size"] = (block[0], block[1])
    return ModelFacts(**facts)


def _moe_layers(data: dict, layers: int, arch: str, path: str) -> tuple[int, ...]:
    """Which decoder layers build a FusedMoE (vLLM's model files): DeepSeek from first_k_dense_replace on every
    moe_layer_freq-th; Qwen MoE every decoder_sparse_step-th but mlp_only_layers; Mixtral every layer."""
    if arch in MLA_ARCHITECTURES:
        first = _int(data, "first_k_dense_replace", 0, where=path)
        freq = _int(data, "moe_layer_freq", 1, where=path) or 1
        return tuple(i for i in range(layers) if i >= first and i % freq == 0)
    if arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        step = _int(data, "decoder_sparse_step", 1, where=path) or 1
        only = data.get("mlp_only_layers") or []
        only = set(only) if isinstance(only, list) else set()
        return tuple(i for i in range(layers) if i not in only and (i + 1) % step == 0)
    return tuple(range(layers))


def pad_vocab(vocab_size: int, tp: int, pad_to: int = 64) -> int:
    """Rows per TP rank of VocabParallelEmbedding / ParallelLMHead: the vocab padded to 64, split over TP."""
    padded = math.ceil(vocab_size / pad_to) * pad_to
    return math.ceil(padded / tp)
