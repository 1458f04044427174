"""A model's config facts, read from its config.json (a local model directory, as `vllm serve DIR` takes one, a
directory of the local Hugging Face cache for a hub id, or a preset shipped in harness/defaults/models/: the public
config facts of the model it names: no weights, no download). Only what sizes memory is kept; each value remembers
the line of config.json it came from.

    architectures          which vLLM model class builds the layers (model_executor/models/*.py): DeepSeek V2/V3/
                           V3.2 and Kimi-K2 (MLA), Qwen2/3-MoE, Qwen3-Next, Mixtral, gpt-oss, GLM-4.5/4.6,
                           MiniMax-M2, Llama-4, and the dense Llama, Mistral, Granite, Phi-2/3/4, Qwen2/3,
                           Gemma 1/2/3; the multimodal LLaVA-NeXT, Mistral 3, Pixtral and Kimi-VL as their
                           text_config's language model plus their vision tower
    hidden_size, num_hidden_layers, vocab_size, tie_word_embeddings
    attention              GQA: num_attention_heads, num_key_value_heads, head_dim, biases, q/k norms, sinks
                           MLA: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
                           per layer: full, sliding window, chunked local, or linear attention (Qwen3-Next's
                           gated delta net, which keeps a state in place of KV); DeepSeek-V3.2's indexer
    MLP / MoE              intermediate_size (dense), moe_intermediate_size, routed experts (n_routed_experts,
                           num_experts or num_local_experts), num_experts_per_tok, shared experts, which layers are
                           MoE (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers,
                           interleave_moe_layer_step)
    quantization_config    the checkpoint format (harness.sizing.quant_formats), or none (the torch_dtype)

A config vLLM could not build is refused in one line naming the field, its value and what vLLM accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import BadInput
from harness.scenario.limits import shown_text
from harness.sizing.quant_formats import (
    SUPPORTED_ACT_DTYPES,
    Quant,
    QuantConfigError,
    online_fp8,
    parse_quant,
)

MODELS_DIR = Path(__file__).resolve().parents[1] / "defaults" / "models"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; a bigger file is not one
MAX_JSON_DEPTH = 64  # a config.json nests a few levels; deeper JSON is refused before it is parsed
MAX_LAYERS = 1024  # a layer count beyond this is not a model's (it would only make the plan slow)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "half": 2, "float": 4}
DTYPE_NAMES = {"half": "float16", "float": "float32"}
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "half", "float32", "float")  # vllm serve --dtype
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM", "DeepseekV32ForCausalLM")
QWEN_MOE = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Qwen3NextForCausalLM")
LLAMA4 = ("Llama4ForConditionalGeneration", "Llama4ForCausalLM")
MOE_ARCHITECTURES = (*MLA_ARCHITECTURES, *QWEN_MOE, "MixtralForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM",
                     "MiniMaxM2ForCausalLM", *LLAMA4)  # fmt: skip
GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "GraniteForCausalLM", "Phi3ForCausalLM")
DENSE_ARCHITECTURES = (*LLAMA_LIKE, "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM", *GEMMA,
                       "PhiForCausalLM")  # fmt: skip
# Multimodal models whose language model is another architecture's, built from text_config
# (init_vllm_registered_model(hf_config=config.text_config)): the vision tower and projector are sized beside it
# (VisionTower), the language model as the architecture its text_config's model_type names.
MULTIMODAL_WRAPPERS = ("LlavaNextForConditionalGeneration", "Mistral3ForConditionalGeneration",
                       "PixtralForConditionalGeneration", "KimiVLForConditionalGeneration")  # fmt: skip
TEXT_ARCHITECTURES = {"granite": "GraniteForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                      "deepseek_v3": "DeepseekV3ForCausalLM"}  # fmt: skip
ARCHITECTURES = (*MOE_ARCHITECTURES, *DENSE_ARCHITECTURES, *MULTIMODAL_WRAPPERS)
# The keys vLLM derives max_model_len from, in its order (config/model.py _get_and_verify_max_len).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")  # fmt: skip


# Fields a config.json may leave out because transformers' config class supplies them, which vLLM then reads:
# transformers/models/gemma3/configuration_gemma3.py Gemma3TextConfig (gemma-3-4b-it's text_config gives neither its
# vocabulary, its positions nor its heads).
CONFIG_CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window_pattern": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
    },
}


class ModelConfigError(BadInput):
    """A model that cannot be read or is not one this model sizes; the message is one line."""


@dataclass(frozen=True)
class VisionTower:
    """A ViT encoder's shapes (Llama-4's vision_model, Gemma 3's SigLIP, LLaVA-NeXT's SigLIP, Pixtral's, Kimi-VL's
    MoonViT) and its projector into the text model."""

    kind: str  # llama4 | siglip | llava | pixtral_hf | pixtral | moonvit
    hidden_size: int
    intermediate_size: int
    num_layers: int
    patch_size: int
    image_size: int
    num_channels: int
    projector_in: int  # what the projector reads (Llama-4: vision_output_dim; SigLIP: hidden_size)
    adapter_out: int = 0  # Llama-4's pixel-shuffle MLP output (projector_output_dim)
    pixel_shuffle_ratio: float = 0.0
    merge: int = 1  # patches merged per side before the projector (Pixtral's spatial_merge_size, MoonViT's kernel)
    projector_bias: bool = True  # the projector's linears have biases (multimodal_projector_bias, adapter_bias)
    pos_emb: tuple[int, int] = (0, 0)  # MoonViT's learned (height, width) position embedding
    num_heads: int = 0  # attention heads (Pixtral's rotary inv_freq is per head_dim)
    pre_norm: bool = True  # an RMSNorm before the patch merger (Pixtral's pre_mm_projector_norm, Mistral 3's norm)
    # What the profile's dummy encoder run reads (harness.sizing.mm_encoder): Gemma 3's mm_tokens_per_image,
    # LLaVA-NeXT's image_grid_pinpoints (height, width) and vision_feature_select_strategy
    tokens_per_image: int = 0
    pinpoints: tuple[tuple[int, int], ...] = ()
    feature_select: str = "default"


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
    # DeepSeek-V3.2's indexer (sparse attention): its weights and its per-token key cache
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0  # the tokens each query attends to (the top-k buffer's width)
    # MoE
    moe_intermediate_size: int = 0
    num_routed_experts: int = 0
    top_k: int = 0
    num_shared_experts: int = 0  # DeepSeek, GLM, Llama-4: n_shared_experts MLPs of moe_intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE, Qwen3-Next (+ a shared_expert_gate)
    moe_layers: tuple[int, ...] = ()
    router_dtype: str = ""  # the gate's dtype when vLLM builds it in f32 (GLM-4.5, MiniMax-M2); else the model's
    router_bias: bool = False  # gpt-oss's router is a Linear with a bias
    score_bias: bool = False  # e_score_correction_bias (f32): DeepSeek-V3, GLM-4.5, MiniMax-M2
    # the router runs vLLM's fused grouped top-k op (grouped_topk_router.py's `grouped_topk` with a score-correction
    # bias): fused_grouped_topk_route
    fused_grouped_topk: bool = False
    expert_bias: bool = False  # gpt-oss: w13_bias, w2_bias
    # attention
    attention_bias: bool = False  # q/k/v biases (Qwen2, GLM-4.5, gpt-oss)
    o_proj_bias: bool = False  # gpt-oss, Llama with attention_bias
    qk_norm: str = ""  # "head": RMSNorm(head_dim) of q and k (Qwen3, Gemma 3, GLM-4.5); "full": MiniMax-M2's
    attention_sinks: bool = False  # gpt-oss: one learned sink per head
    gated_attention: bool = False  # Qwen3-Next: q_proj also makes the output gate (2x the query width)
    rotary_dim: int = 0  # partial rotary (GLM, MiniMax, Qwen3-Next); 0: head_dim
    rotary_dtype: str = ""  # gpt-oss builds its rope cache in f32
    rope_positions: tuple[int, ...] = ()  # rows of each distinct get_rope cache (rope_scaling; Gemma 3 has two)
    norms_per_layer: int = 2  # Gemma 2/3: 4; Phi-2: 1 (attention and MLP in parallel)
    norm_bias: bool = False  # LayerNorm (weight and bias) in place of RMSNorm: Phi-2
    mlp_gated: bool = True  # gate_up + down; Phi-2: fc1 + fc2 with biases
    lm_head_bias: bool = False  # Phi-2
    layer_kinds: tuple[str, ...] = ()  # per layer: full | sliding | chunked | linear
    sliding_window: int = 0
    attention_chunk_size: int = 0
    # Qwen3-Next's linear attention (gated delta net)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    vision: VisionTower | None = None
    quant: Quant | None = None
    checkpoint_dtype: str = ""  # the config's torch_dtype, before --dtype
    # the model directory's *.safetensors: True / False for a directory given on the serve line (what vLLM reads
    # the quantized layers of some formats from), None for a preset or hub id (the published checkpoint)
    checkpoint_tensors: bool | None = None
    lines: dict[str, int] = field(default_factory=dict, compare=False)
    # how a model named on the serve line but not on this machine was read (absent_path_model), else ""
    read_as: str = field(default="", compare=False)

    @property
    def is_mla(self) -> bool:
        return self.architecture in MLA_ARCHITECTURES

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def quant_method(self) -> str | None:
        """fp8 for FP8 checkpoints of every kind the layer model knows (its experts family), else the method."""
        if self.quant is None:
            return None
        return "fp8" if self.quant.scheme.startswith("fp8") else self.quant.method

    @property
    def weight_block_size(self) -> tuple[int, int] | None:
        return self.quant.block if self.quant is not None and self.quant.scheme == "fp8-block" else None

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds or ("full",) * self.num_hidden_layers

    def ref(self, *keys: str) -> str:
        """'config.json:12' for the first key that has a line (the preset's file name for presets)."""
        for key in keys:
            if key in self.lines:
                return f"{self.path}:{self.lines[key]}"
        return self.path


def preset_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def _preset_hub_ids() -> dict[str, str]:
    """hub id (lower case) -> preset name, from each preset's `_hf_id` (or its `_source`'s first word)."""
    ids: dict[str, str] = {}
    for preset in sorted(MODELS_DIR.glob("*.json")):
        try:
            data = json.loads(preset.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        hub = data.get("_hf_id") or str(data.get("_source", "")).split(" ")[0]
        if isinstance(hub, str) and "/" in hub:
            ids[hub.lower()] = preset.stem
    return ids


def _hub_caches() -> list[Path]:
    """Where huggingface_hub keeps snapshots: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return [Path(os.environ["HF_HUB_CACHE"])]
    home = Path(os.environ["HF_HOME"]) if os.environ.get("HF_HOME") else Path.home() / ".cache" / "huggingface"
    return [home / "hub"]


def hub_snapshot_config(hub_id: str) -> Path | None:
    """config.json of hub_id's snapshot in the local Hugging Face cache (models--org--name/snapshots/<rev>/): the
    revision refs/main names, else the newest snapshot holding a config.json. Nothing is fetched."""
    for cache in _hub_caches():
        repo = cache / ("models--" + hub_id.replace("/", "--"))
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = repo / "refs" / "main"
        try:
            rev = ref.read_text(encoding="utf-8").strip()[:80] if ref.is_file() else ""
        except OSError:
            rev = ""
        if rev and re.fullmatch(r"[0-9A-Za-z._-]+", rev) and (snapshots / rev / "config.json").is_file():
            return snapshots / rev / "config.json"
        found = [p / "config.json" for p in snapshots.iterdir() if (p / "config.json").is_file()]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    return None


def load_model(model: str, *, dtype: str | None = "auto", quantization: str | None = None) -> ModelFacts:
    """A local directory holding config.json, a config.json file, a preset name or a hub id (a preset's, or one in
    the local Hugging Face cache). `dtype` and `quantization` are vllm serve's --dtype and --quantization."""
    if len(model) > 4096 or "\0" in model:
        raise ModelConfigError(f"model {shown_text(model, 60)}: not a usable path or name")
    path = Path(model)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelConfigError(
                f"model {shown_text(model)}: the directory has no config.json (vllm serve reads it from there)"
            )
        # a name printed as it is: escaped once, here
        facts = parse_config(config, name=shown_text(path.name), dtype=dtype, quantization=quantization)
        return dataclasses.replace(facts, checkpoint_tensors=holds_safetensors(path))
    if path.is_file() and path.suffix == ".json":
        facts = parse_config(path, name=shown_text(path.parent.name or path.stem), dtype=dtype,
                             quantization=quantization)  # fmt: skip
        return dataclasses.replace(facts, checkpoint_tensors=holds_safetensors(path.parent))
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", model.lower()) and (MODELS_DIR / f"{model.lower()}.json").is_file():
        return _preset_facts(model.lower(), dtype, quantization)
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}", model):
        name = _preset_hub_ids().get(model.lower())
        if name is not None:
            return _preset_facts(name, dtype, quantization)
        cached = hub_snapshot_config(model)
        if cached is not None:
            return parse_config(cached, name=model.split("/")[1], dtype=dtype, quantization=quantization)
        same_name = _preset_named(model.split("/")[1])
        if same_name is not None:  # a relative directory on the GPU host, or another org's upload of that model
            return _preset_facts(same_name, dtype, quantization, read_as=(
                f"{model} is neither a preset's hub id nor in the local Hugging Face cache nor a directory here; "
                f"read as the preset its name names, {PRESET_SHOWN.format(same_name)} (another upload or directory "
                "of that name may hold another checkpoint format: give its config.json to be sure)"))  # fmt: skip
        raise ModelConfigError(f"model {model}: a hub id that is neither a preset nor in the local Hugging Face cache "
                               f"({shown_text(str(_hub_caches()[0]))}); give a directory holding its config.json, or "
                               "one of the "
                               f"presets: {', '.join(preset_names())}")  # fmt: skip
    named = absent_path_model(model)
    if named is not None:
        hub_id, preset_name = named
        absent = f"{shown_text(model, 120)} is not on this machine"
        if preset_name is not None:
            return _preset_facts(preset_name, dtype, quantization, read_as=f"{absent}; read as the preset its name "
                                 f"names, {PRESET_SHOWN.format(preset_name)}")  # fmt: skip
        cached = hub_snapshot_config(hub_id) if hub_id else None
        if cached is not None:
            facts = parse_config(cached, name=hub_id.split("/")[1], dtype=dtype, quantization=quantization)
            return dataclasses.replace(facts, read_as=f"{absent}; read as {hub_id} from the local Hugging Face cache")
    raise ModelConfigError(f"model {shown_text(model)}: not a directory with config.json nor a preset; presets: "
                           f"{', '.join(preset_names())}")  # fmt: skip


PRESET_SHOWN = "harness/defaults/models/{}.json"


def _preset_facts(name: str, dtype: str | None, quantization: str | None, *, read_as: str = "") -> ModelFacts:
    """A preset's facts, its file shown as harness/defaults/models/NAME.json; `read_as`: how the serve line's model
    came to be read as it."""
    facts = parse_config(MODELS_DIR / f"{name}.json", name=name, shown=PRESET_SHOWN.format(name), dtype=dtype,
                         quantization=quantization)  # fmt: skip
    return dataclasses.replace(facts, read_as=read_as) if read_as else facts


def absent_path_model(model: str) -> tuple[str, str | None] | None:
    """(hub id or "", preset name or None) for a model path that is not on this machine: a serve line pasted from
    the GPU host names its own directory. A Hugging Face cache path (.../models--ORG--NAME/snapshots/REV, what vLLM
    serves offline) names the hub id ORG/NAME: its preset, else the local cache's snapshot. Otherwise the path's last
    component is matched, case-insensitively, against the presets' names and their hub ids' names; a name that
    matches no preset, or more than one, is not read (None)."""
    if "/" not in model and "\\" not in model:
        return None
    parts = [p for p in re.split(r"[/\\]", model) if p and p not in (".", "..")]
    for part in reversed(parts):
        cached = re.fullmatch(r"models--([A-Za-z0-9][A-Za-z0-9._-]{0,95})--([A-Za-z0-9][A-Za-z0-9._-]{0,95})", part)
        if cached:
            hub_id = f"{cached.group(1)}/{cached.group(2)}"
            return hub_id, _preset_hub_ids().get(hub_id.lower())
    named = _preset_named(parts[-1]) if parts else None
    return ("", named) if named is not None else None


def _preset_named(name: str) -> str | None:
    """The one preset whose name, or whose hub id's name, is `name` (any case); None for none or several."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", name):
        return None
    name = name.lower()
    matches = {stem for stem in preset_names() if stem == name}
    matches |= {stem for hub, stem in _preset_hub_ids().items() if hub.split("/", 1)[1] == name}
    return matches.pop() if len(matches) == 1 else None


def holds_safetensors(directory: Path) -> bool:
    """Whether the directory holds a *.safetensors file (its names only; nothing is read)."""
    try:
        return any(p.suffix == ".safetensors" for p in directory.iterdir())
    except OSError:
        return False


def _key_lines(text: str) -> dict[str, int]:
    """Line of the first occurrence of each top-level-looking key (`"name":`), for file:line sources."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', line):
            lines.setdefault(match.group(1), number)
    return lines


def json_depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest (strings skipped), without parsing it: deep JSON is refused
    before json.loads would recurse into it."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads_bounded(text: str, *, what: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """json.loads of a text nested at most max_depth deep; ValueError in one line otherwise."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"{what} nests {depth} levels deep; at most {max_depth} are read")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} nests too deep to read") from None


def parse_config(path: Path, *, name: str, shown: str | None = None, dtype: str | None = "auto",
                 quantization: str | None = None) -> ModelFacts:  # fmt: skip
    where = shown or shown_text(str(path))  # printed as it is: escaped once, here
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelConfigError(f"{where}: {path.stat().st_size} bytes is not a config.json (at most 1 MiB)")
        text = path.read_text(encoding="utf-8")
        data = loads_bounded(text, what="config.json")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ModelConfigError(f"{where}: not a readable JSON config: {shown_text(str(error), 120)}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{where}: a config.json is a JSON object")
    return facts_from(data, name=name, path=where, lines=_key_lines(text), dtype=dtype,
                      quantization=quantization)  # fmt: skip


def shown(value: object) -> str:
    """A config value as config.json spells it, cut to 40 characters and printable on one line."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(data: dict, key: str, default: int | None = None, *, where: str, minimum: int = 0) -> int:
    value = data.get(key, default)
    if value is None and default is None:
        raise ModelConfigError(f"{where}: {key} is missing; vLLM reads it from the config.json of this architecture")
    if value is None:
        value = default
    if type(value) is not int or not minimum <= value <= 10**8:
        raise ModelConfigError(f"{where}: {key} = {shown(value)}; vLLM needs an integer >= {minimum}")
    return value


def _layer_list(data: dict, key: str, layers: int, where: str) -> set[int]:
    value = data.get(key)
    if value is None:
        return set()
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v < max(layers, 1) for v in value):
        raise ModelConfigError(f"{where}: {key} = {shown(value)}; vLLM reads a list of layer indices "
                               f"0..{layers - 1}")  # fmt: skip
    return set(value)


def _resolve_dtype(config_dtype: str, dtype: str | None, quant: Quant | None, where: str) -> str:
    """vLLM's --dtype (config/model.py _get_and_verify_dtype): auto is the checkpoint's dtype, float32 checkpoints
    downcast to bfloat16; the quantization's supported activation dtypes refuse the rest."""
    dtype = DTYPE_NAMES.get(dtype or "auto", dtype or "auto")
    if dtype == "auto":
        resolved = "bfloat16" if config_dtype == "float32" else config_dtype
        if quant is not None and resolved not in SUPPORTED_ACT_DTYPES.get(quant.method, (resolved,)):
            resolved = SUPPORTED_ACT_DTYPES[quant.method][0]  # e.g. AWQ's float16 checkpoints stay float16
    elif dtype in DTYPE_BYTES:
        resolved = dtype
    else:
        raise ModelConfigError(f"--dtype {dtype[:20]!r}; vLLM accepts auto, bfloat16, float16 (half), float32 (float)")
    if quant is not None:
        allowed = SUPPORTED_ACT_DTYPES.get(quant.method, ())
        if allowed and resolved not in allowed:
            raise ModelConfigError(f"{where}: --dtype {resolved} is not supported for quantization method "
                                   f"{quant.method}; vLLM accepts {', '.join(allowed)} "
                                   "(the method's get_supported_act_dtypes)")  # fmt: skip
    return resolved


def facts_from(data: dict, *, name: str, path: str, lines: dict[str, int] | None = None, dtype: str | None = "auto",
               quantization: str | None = None) -> ModelFacts:  # fmt: skip
    archs = data.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None) if isinstance(archs, list) else None
    if arch is None:
        raise ModelConfigError(f"{path}: architectures {shown(archs)} is not one this model sizes; allowed: "
                               f"{', '.join(ARCHITECTURES)}")  # fmt: skip
    top = data
    text = data.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ModelConfigError(f"{path}: text_config = {shown(text)} is not a JSON object")
    wrapper = arch if arch in MULTIMODAL_WRAPPERS else ""
    if wrapper:
        kind = text.get("model_type") if isinstance(text, dict) else None
        if kind not in TEXT_ARCHITECTURES:
            raise ModelConfigError(f"{path}: text_config.model_type = {shown(kind)}; {arch}'s language model is sized "
                                   f"for {', '.join(TEXT_ARCHITECTURES)}")  # fmt: skip
        arch = TEXT_ARCHITECTURES[kind]
        archs = [arch]
    if isinstance(text, dict) and "hidden_size" not in data:
        data = {**text, "architectures": archs}
        for key in ("quantization_config", "torch_dtype", "tie_word_embeddings"):
            if key in top and key not in data:
                data[key] = top[key]
    for key, value in CONFIG_CLASS_DEFAULTS.get(str(data.get("model_type")), {}).items():
        data.setdefault(key, value)
    quant_raw = data.get("quantization_config")
    try:
        quant = parse_quant(quant_raw) if quant_raw is not None else None
    except QuantConfigError as error:
        raise ModelConfigError(f"{path}: {error}") from None
    if quantization is not None:
        quant = _given_quantization(quantization, quant, path)

    def get(key: str, default: int | None = None, minimum: int = 0) -> int:
        return _int(data, key, default, where=path, minimum=minimum)

    hidden = get("hidden_size", minimum=1)
    layers = get("num_hidden_layers", minimum=1)
    if layers > MAX_LAYERS:
        raise ModelConfigError(f"{path}: num_hidden_layers = {layers}; at most {MAX_LAYERS} are read (vLLM's models "
                               "have a few hundred at most)")  # fmt: skip
    heads = get("num_attention_heads", minimum=1)
    kv_heads = get("num_key_value_heads", heads, minimum=1)
    head_dim = get("head_dim", 0) or hidden // heads
    if head_dim <= 0:
        raise ModelConfigError(f"{path}: head_dim is hidden_size {hidden} // num_attention_heads {heads} = 0; vLLM "
                               "needs head_dim >= 1")  # fmt: skip
    if heads % kv_heads:
        raise ModelConfigError(f"{path}: num_key_value_heads = {kv_heads}; vLLM's attention needs it to divide "
                               f"num_attention_heads ({heads})")  # fmt: skip
    max_len = _max_len(data, path)
    config_dtype = data.get("torch_dtype") or data.get("dtype") or "bfloat16"
    if not isinstance(config_dtype, str) or DTYPE_NAMES.get(config_dtype, config_dtype) not in DTYPE_BYTES:
        raise ModelConfigError(f"{path}: torch_dtype {shown(config_dtype)}; allowed: {', '.join(DTYPE_BYTES)}")
    config_dtype = DTYPE_NAMES.get(config_dtype, config_dtype)
    facts: dict = dict(
        name=name, path=path, architecture=arch, hidden_size=hidden, num_hidden_layers=layers,
        vocab_size=get("vocab_size", minimum=1), tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=get("intermediate_size", 0), dtype=_resolve_dtype(config_dtype, dtype, quant, path),
        checkpoint_dtype=config_dtype, max_position_embeddings=max_len, lines=lines or {}, quant=quant,
    )  # fmt: skip
    if arch in MLA_ARCHITECTURES:
        q_lora = data.get("q_lora_rank")
        facts.update(q_lora_rank=q_lora if type(q_lora) is int and q_lora > 0 else None,
                     kv_lora_rank=get("kv_lora_rank", minimum=1), qk_nope_head_dim=get("qk_nope_head_dim", minimum=1),
                     qk_rope_head_dim=get("qk_rope_head_dim", minimum=1), v_head_dim=get("v_head_dim", minimum=1),
                     score_bias=data.get("topk_method") == "noaux_tc")  # fmt: skip
        if arch == "DeepseekV32ForCausalLM":
            facts.update(
                index_n_heads=get("index_n_heads", minimum=1),
                index_head_dim=get("index_head_dim", minimum=1),
                index_topk=get("index_topk", minimum=1),
            )
    if arch in MOE_ARCHITECTURES:
        _moe_facts(data, facts, arch, layers, path, get)
    _attention_facts(data, facts, arch, layers, path, get)
    if arch in ("Llama4ForConditionalGeneration", "Gemma3ForConditionalGeneration") or wrapper:
        if not isinstance(top.get("vision_config"), dict):
            raise ModelConfigError(f"{path}: vision_config = {shown(top.get('vision_config'))}; vLLM builds "
                                   f"{wrapper or arch}'s vision tower from a vision_config object")  # fmt: skip
        facts["vision"] = _vision(top["vision_config"], wrapper or arch, path, top)
    return ModelFacts(**facts)


# --quantization values that name the same checkpoint format (vLLM's override_quantization_method upgrades awq and
# gptq checkpoints to their Marlin methods on GPUs that run them).
SAME_METHOD = {"awq": "awq_marlin", "gptq": "gptq_marlin", "modelopt_fp4": "modelopt"}


def _given_quantization(given: str, quant: Quant | None, path: str) -> Quant:
    """vllm serve --quantization: fp8 quantizes an unquantized checkpoint on load; otherwise it must name the
    checkpoint's own method (config/model.py _verify_quantization refuses a mismatch)."""
    if quant is None:
        if given != "fp8":
            raise ModelConfigError(
                f"--quantization {given}: {path} has no quantization_config; vLLM quantizes an "
                "unquantized checkpoint on load with fp8 only (of the methods sized here)"
            )
        return online_fp8()

    def canonical(method: str) -> str:
        return SAME_METHOD.get(method, method)

    if canonical(given) != canonical(quant.method):
        raise ModelConfigError(f"--quantization {given} does not match {path}'s quantization_config (quant_method "
                               f"{quant.method}); vLLM refuses the mismatch")  # fmt: skip
    return quant


def _max_len(data: dict, path: str) -> int:
    """The derived max_model_len's source: the first of vLLM's keys present; refused when none is, or when it is
    not a positive integer (vLLM's own fallback of 2048 would plan a context the model may not have)."""
    for key in MAX_LEN_KEYS:
        if key in data:
            value = data[key]
            if type(value) is not int or value < 1:
                raise ModelConfigError(f"{path}: {key} = {shown(value)}; vLLM derives max_model_len from it and "
                                       "needs an integer >= 1")  # fmt: skip
            return value
    raise ModelConfigError(f"{path}: max_position_embeddings is missing (nor any of {', '.join(MAX_LEN_KEYS[1:])}); "
                           "vLLM would assume 2048 tokens: give the field")  # fmt: skip


def _moe_facts(data: dict, facts: dict, arch: str, layers: int, path: str, get) -> None:
    experts = data.get("n_routed_experts", data.get("num_experts", data.get("num_local_experts")))
    facts["num_routed_experts"] = _int({"num_experts": experts}, "num_experts", where=path, minimum=1)
    facts["top_k"] = get("num_experts_per_tok", minimum=1)
    if facts["top_k"] > facts["num_routed_experts"]:
        raise ModelConfigError(f"{path}: num_experts_per_tok = {facts['top_k']}; vLLM needs at most the "
                               f"{facts['num_routed_experts']} routed experts")  # fmt: skip
    if arch in LLAMA4:  # intermediate_size is the experts', intermediate_size_mlp the dense layers'
        facts["moe_intermediate_size"] = get("intermediate_size", minimum=1)
        facts["intermediate_size"] = get("intermediate_size_mlp", facts["moe_intermediate_size"])
        facts["num_shared_experts"] = 1  # llama4.py Llama4MoE.shared_expert: one MLP of intermediate_size
    elif arch in ("GptOssForCausalLM", "MiniMaxM2ForCausalLM", "MixtralForCausalLM"):
        facts["moe_intermediate_size"] = get("intermediate_size", minimum=1)
    else:
        facts["moe_intermediate_size"] = get("moe_intermediate_size", facts["intermediate_size"] or None, minimum=1)
    if arch in MLA_ARCHITECTURES or arch == "Glm4MoeForCausalLM":
        facts["num_shared_experts"] = get("n_shared_experts", 0)
    if arch in ("Qwen2MoeForCausalLM", "Qwen3NextForCausalLM"):
        facts["shared_expert_intermediate_size"] = get("shared_expert_intermediate_size", 0)
    if arch == "GptOssForCausalLM":
        facts.update(router_bias=True, expert_bias=True)
    if arch == "Glm4MoeForCausalLM":
        facts.update(router_dtype="float32", score_bias=True)
    if arch == "MiniMaxM2ForCausalLM":
        facts.update(router_dtype="float32", score_bias=bool(data.get("use_routing_bias", False)))
    facts["moe_layers"] = _moe_layers(data, layers, arch, path)
    facts["fused_grouped_topk"] = fused_grouped_topk_route(data, arch, facts)


def fused_grouped_topk_route(data: dict, arch: str, facts: dict) -> bool:
    """Whether the MoE router runs vLLM's fused grouped top-k op, as vLLM 0.26.0 builds the router: the models that
    pass `use_grouped_topk=True` to FusedMoE (models/deepseek_v2.py DeepseekV2MoE with n_group, topk_group and
    scoring_func from the config, defaults 1, 1 and softmax, and an e_score_correction_bias where topk_method is
    noaux_tc; models/glm4_moe.py Glm4MoE, always sigmoid with a bias) get a GroupedTopKRouter unless its routing
    method is Unspecified with one group (fused_moe/router/router_factory.py; config.py get_routing_method_type: a
    bias with sigmoid and renormalize is DeepSeekV3's), whose _compute_routing calls `grouped_topk` where the
    experts divide into more than n_group groups, and that function takes the fused op (`ops.grouped_topk`,
    `_moe_C::grouped_topk`) with a bias, at most 32 groups and top-k at most 32 on CUDA
    (grouped_topk_router.py)."""
    if arch not in (*MLA_ARCHITECTURES, "Glm4MoeForCausalLM") or not facts.get("score_bias"):
        return False
    groups, topk_groups = data.get("n_group", 1), data.get("topk_group", 1)
    scoring = "sigmoid" if arch == "Glm4MoeForCausalLM" else data.get("scoring_func", "softmax")
    renormalize = bool(data.get("norm_topk_prob", True))  # DeepseekV3Config and Glm4MoeConfig default it on
    if not (type(groups) is int and type(topk_groups) is int and groups > 0):
        return False
    method = scoring == "sigmoid" and renormalize  # DeepSeekV3's routing method; any other is Unspecified
    experts, top_k = facts["num_routed_experts"], facts["top_k"]
    grouped = method or groups > 1 or topk_groups > 1
    return grouped and experts > groups and experts % groups == 0 and groups <= 32 and top_k <= 32


def _attention_facts(data: dict, facts: dict, arch: str, layers: int, path: str, get) -> None:
    head_dim = facts["head_dim"]
    bias = bool(data.get("attention_bias", False))
    facts["attention_bias"] = arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM") or bias
    facts["o_proj_bias"] = arch in ("GptOssForCausalLM", "PhiForCausalLM") or (arch in LLAMA_LIKE and bias)
    if arch == "PhiForCausalLM":  # phi.py: qkv_proj and dense with biases, one LayerNorm, fc1/fc2, a biased lm_head
        facts.update(attention_bias=True, norms_per_layer=1, norm_bias=True, mlp_gated=False, lm_head_bias=True)
    if arch == "GemmaForCausalLM":
        facts["tie_word_embeddings"] = bool(data.get("tie_word_embeddings", True))
    head_norm = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Gemma3ForCausalLM",
                 "Gemma3ForConditionalGeneration")  # fmt: skip
    if arch in head_norm or (arch == "Glm4MoeForCausalLM" and data.get("use_qk_norm")):
        facts["qk_norm"] = "head"
    if arch == "MiniMaxM2ForCausalLM":
        facts["qk_norm"] = "full" if data.get("use_qk_norm", True) else ""
    factor = data.get("partial_rotary_factor")
    if isinstance(factor, (int, float)) and 0 < factor < 1:
        facts["rotary_dim"] = int(head_dim * factor)
    if arch == "MiniMaxM2ForCausalLM":
        facts["rotary_dim"] = get("rotary_dim", head_dim, minimum=1)
    if arch in GEMMA:
        facts["norms_per_layer"] = 4
        facts["tie_word_embeddings"] = bool(data.get("tie_word_embeddings", True))
    kinds = ["full"] * layers
    if arch == "GptOssForCausalLM":
        facts.update(attention_sinks=True, rotary_dtype="float32")
        window = get("sliding_window", minimum=1)
        kinds = _layer_types(data, layers, path) or ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
        facts["sliding_window"] = window
    elif arch in GEMMA:
        window = get("sliding_window", 4096, minimum=1)
        pattern = get("sliding_window_pattern", 6 if arch != "Gemma2ForCausalLM" else 2, minimum=1)
        kinds = _layer_types(data, layers, path) or (
            ["sliding" if i % 2 == 0 else "full" for i in range(layers)] if arch == "Gemma2ForCausalLM"
            else ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers)])  # fmt: skip
        facts["sliding_window"] = window
    elif arch in ("MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM") and type(data.get("sliding_window")) \
            is int and data.get("use_sliding_window", arch == "MistralForCausalLM"):  # fmt: skip
        facts["sliding_window"] = get("sliding_window", minimum=1)
        kinds = ["sliding"] * layers
    elif arch in LLAMA4:
        chunk = data.get("attention_chunk_size")
        nope = data.get("no_rope_layers")
        if nope is not None and not (isinstance(nope, list) and len(nope) == layers and
                                     all(v in (0, 1) for v in nope)):  # fmt: skip
            raise ModelConfigError(f"{path}: no_rope_layers = {shown(nope)}; vLLM reads a list of 0/1, one per "
                                   f"layer ({layers})")  # fmt: skip
        interval = get("no_rope_layer_interval", 4, minimum=1)
        rope = nope if nope else [int((i + 1) % interval != 0) for i in range(layers)]
        if type(chunk) is int and chunk > 0:
            facts["attention_chunk_size"] = chunk
            kinds = ["chunked" if rope[i] else "full" for i in range(layers)]
    elif arch == "Qwen3NextForCausalLM":
        interval = get("full_attention_interval", 4, minimum=1)
        kinds = _layer_types(data, layers, path) or [
            "full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]  # fmt: skip
        facts.update(gated_attention=True, linear_num_key_heads=get("linear_num_key_heads", minimum=1),
                     linear_num_value_heads=get("linear_num_value_heads", minimum=1),
                     linear_key_head_dim=get("linear_key_head_dim", minimum=1),
                     linear_value_head_dim=get("linear_value_head_dim", minimum=1),
                     linear_conv_kernel_dim=get("linear_conv_kernel_dim", minimum=1))  # fmt: skip
    facts["layer_kinds"] = tuple(kinds) if set(kinds) != {"full"} else ()
    facts["rope_positions"] = _rope_positions(data, facts, arch, path)


def _rope_positions(data: dict, facts: dict, arch: str, path: str) -> tuple[int, ...]:
    """How many positions each rotary cache holds (rotary_embedding/__init__.py get_rope; one cache per distinct
    configuration): max_position_embeddings, times the factor for linear and dynamic scaling (their
    _compute_cos_sin_cache covers max_position x scaling_factor), original_max_position_embeddings x factor for yarn;
    llama3 and no scaling cover max_position. Gemma 3 keeps two: its sliding layers' unscaled local rope and its
    global layers' scaled one, each where a layer of its type exists."""
    positions = facts["max_position_embeddings"]
    scaling = data.get("rope_scaling")
    if scaling is None:
        return (positions,)
    if not isinstance(scaling, dict):
        raise ModelConfigError(f"{path}: rope_scaling = {shown(scaling)} is not a JSON object (vLLM reads its "
                               "rope_type and factor)")  # fmt: skip
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = scaling.get("factor", 1)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1e4:
        raise ModelConfigError(f"{path}: rope_scaling.factor = {shown(factor)}; vLLM needs a positive number")
    if kind in ("linear", "dynamic"):
        scaled = int(positions * factor)
    elif kind in ("yarn", "deepseek_yarn"):
        original = scaling.get("original_max_position_embeddings", positions)
        scaled = int(original * factor) if type(original) is int and original > 0 else positions
    else:
        scaled = positions
    if arch in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration") and scaled != positions:
        # gemma3.py builds each layer's rope from its layer type: the cache of a type no layer has is never made
        # (a config cut to its first layers may hold sliding ones alone)
        kinds = set(facts.get("layer_kinds") or ("full",))
        return tuple(n for n, kind in ((positions, "sliding"), (scaled, "full")) if kind in kinds)
    return (scaled,)


LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
               "chunked_attention": "chunked"}  # fmt: skip


def _layer_types(data: dict, layers: int, path: str) -> list[str]:
    value = data.get("layer_types")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) != layers or not all(v in LAYER_TYPES for v in value):
        raise ModelConfigError(f"{path}: layer_types = {shown(value)}; vLLM reads one of "
                               f"{', '.join(LAYER_TYPES)} per layer ({layers})")  # fmt: skip
    return [LAYER_TYPES[v] for v in value]


def _vision(config: dict, arch: str, path: str, top: dict | None = None) -> VisionTower:
    def get(key: str, default: int | None = None) -> int:
        return _int(config, key, default, where=f"{path} vision_config", minimum=1)

    if arch in MULTIMODAL_WRAPPERS:
        return _wrapper_vision(config, arch, path, top or {}, get)

    if arch in LLAMA4:
        ratio = config.get("pixel_shuffle_ratio", 0.5)
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ModelConfigError(f"{path}: vision_config.pixel_shuffle_ratio = {shown(ratio)}; vLLM needs a "
                                   "number in (0, 1]")  # fmt: skip
        return VisionTower("llama4", get("hidden_size"), get("intermediate_size"), get("num_hidden_layers"),
                           get("patch_size"), get("image_size"), get("num_channels", 3),
                           projector_in=get("vision_output_dim"), adapter_out=get("projector_output_dim"),
                           pixel_shuffle_ratio=float(ratio), num_heads=_heads(config))  # fmt: skip
    # Gemma3Config's mm_tokens_per_image (default 256): the projector's pooled tokens per image
    tokens = _int(top or {}, "mm_tokens_per_image", 256, where=path, minimum=1)
    return VisionTower(
        "siglip",
        get("hidden_size"),
        get("intermediate_size"),
        get("num_hidden_layers"),
        get("patch_size"),
        get("image_size"),
        get("num_channels", 3),
        projector_in=get("hidden_size"),
        num_heads=_heads(config),
        tokens_per_image=tokens,
    )


def _heads(config: dict) -> int:
    """The vision tower's attention heads where the config gives them (0 where it does not: only the dummy encoder
    run's sizing reads them)."""
    value = config.get("num_attention_heads")
    return value if type(value) is int and 0 < value <= 10**4 else 0


# transformers' LlavaNextConfig default image_grid_pinpoints, where config.json leaves them out
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def _pinpoints(top: dict, path: str) -> tuple[tuple[int, int], ...]:
    value = top.get("image_grid_pinpoints")
    if value is None:
        return LLAVA_NEXT_PINPOINTS
    if not (isinstance(value, list) and value and len(value) <= 1024 and all(
            isinstance(p, list) and len(p) == 2 and all(type(x) is int and 0 < x <= 10**5 for x in p)
            for p in value)):  # fmt: skip
        raise ModelConfigError(f"{path}: image_grid_pinpoints = {shown(value)}; vLLM reads a list of [height, "
                               "width] pairs of positive integers")  # fmt: skip
    return tuple((p[0], p[1]) for p in value)


def _feature_layers(top: dict, layers: int, path: str) -> tuple[int, int]:
    """(layers built, feature layers concatenated) of a LLaVA vision tower: llava.py _get_num_hidden_layers builds the
    encoder up to the deepest of vision_feature_layer (an index or a list; negative from the end), and
    LlavaMultiModalProjector reads the selected layers' hidden states side by side."""
    value = top.get("vision_feature_layer", -2)
    chosen = value if isinstance(value, list) else [value]
    if not chosen or not all(type(v) is int and -layers <= v <= layers and v != 0 for v in chosen):
        raise ModelConfigError(f"{path}: vision_feature_layer = {shown(value)}; vLLM reads a layer index (or a list "
                               f"of them) from -{layers} to {layers}, not 0")  # fmt: skip
    return max(v if v > 0 else layers + v + 1 for v in chosen), len(chosen)


def _wrapper_vision(config: dict, arch: str, path: str, top: dict, get) -> VisionTower:
    """The vision tower of a LLaVA-NeXT (SigLIP), Mistral 3 (Pixtral, Hugging Face layout), Pixtral (Mistral's own
    layout) or Kimi-VL (MoonViT) model."""
    H, F, layers = get("hidden_size"), get("intermediate_size"), get("num_hidden_layers")
    patch, channels = get("patch_size"), get("num_channels", 3)
    if arch == "LlavaNextForConditionalGeneration":
        if config.get("model_type") != "siglip_vision_model":
            raise ModelConfigError(f"{path}: vision_config.model_type = {shown(config.get('model_type'))}; the "
                                   "LLaVA-NeXT vision tower is sized for siglip_vision_model")  # fmt: skip
        built, features = _feature_layers(top, layers, path)
        bias = top.get("multimodal_projector_bias", True)
        select = top.get("vision_feature_select_strategy", "default")
        if select not in ("default", "full", "class"):  # vision.py get_num_selected_vision_tokens
            raise ModelConfigError(f"{path}: vision_feature_select_strategy = {shown(select)}; vLLM reads class, "
                                   "default or full")  # fmt: skip
        return VisionTower("llava", H, F, built, patch, get("image_size"), channels, projector_in=H * features,
                           projector_bias=bias is not False, num_heads=_heads(config),
                           pinpoints=_pinpoints(top, path), feature_select=select)  # fmt: skip
    if arch == "KimiVLForConditionalGeneration":
        kernel = config.get("merge_kernel_size", [2, 2])
        if not (isinstance(kernel, list) and len(kernel) == 2 and all(type(k) is int and k > 0 for k in kernel)
                and kernel[0] == kernel[1]):  # fmt: skip
            raise ModelConfigError(f"{path}: vision_config.merge_kernel_size = {shown(kernel)}; vLLM's MoonViT reads "
                                   "a square [k, k]")  # fmt: skip
        pos_emb = (get("init_pos_emb_height"), get("init_pos_emb_width"))
        return VisionTower("moonvit", H, F, layers, patch, 0, channels, projector_in=H * kernel[0] ** 2,
                           merge=kernel[0], pos_emb=pos_emb, num_heads=_heads(config))  # fmt: skip
    image = get("image_size", config.get("max_image_size"))
    merge = _int(top, "spatial_merge_size", config.get("spatial_merge_size", 1), where=path, minimum=1)
    if arch == "PixtralForConditionalGeneration":  # Mistral's params.json layout: vision_encoder's own keys
        # pixtral.py: the patch merger where mm_projector_id is "patch_merge", the RMSNorm before it where
        # add_pre_mm_projector_layer_norm
        merge = merge if config.get("mm_projector_id") == "patch_merge" else 1
        return VisionTower("pixtral", H, F, layers, patch, image, channels, projector_in=H * merge**2, merge=merge,
                           projector_bias=config.get("adapter_bias", True) is not False,
                           pre_norm=config.get("add_pre_mm_projector_layer_norm") is True,
                           num_heads=_heads(config))  # fmt: skip
    return VisionTower("pixtral_hf", H, F, layers, patch, image, channels, projector_in=H * merge**2, merge=merge,
                       projector_bias=top.get("multimodal_projector_bias", True) is not False,
                       num_heads=get("num_attention_heads"))  # fmt: skip


def _moe_layers(data: dict, layers: int, arch: str, path: str) -> tuple[int, ...]:
    """Which decoder layers build a FusedMoE (vLLM's model files): DeepSeek from first_k_dense_replace on every
    moe_layer_freq-th, GLM-4.5 from first_k_dense_replace; Qwen MoE every decoder_sparse_step-th but
    mlp_only_layers; Llama-4 every interleave_moe_layer_step-th; Mixtral, gpt-oss and MiniMax-M2 every layer."""
    if arch in MLA_ARCHITECTURES or arch == "Glm4MoeForCausalLM":
        first = _int(data, "first_k_dense_replace", 0, where=path)
        freq = _int(data, "moe_layer_freq", 1, where=path, minimum=1) if arch in MLA_ARCHITECTURES else 1
        return tuple(i for i in range(layers) if i >= first and i % freq == 0)
    if arch in QWEN_MOE:
        step = _int(data, "decoder_sparse_step", 1, where=path, minimum=1)
        only = _layer_list(data, "mlp_only_layers", layers, path)
        return tuple(i for i in range(layers) if i not in only and (i + 1) % step == 0)
    if arch in LLAMA4:
        step = _int(data, "interleave_moe_layer_step", 1, where=path)
        return tuple(i for i in range(layers) if step > 0 and (i + 1) % step == 0)
    return tuple(range(layers))


def check_parallel(facts: ModelFacts, tp: int) -> None:
    """What vLLM refuses of a model at this tensor parallel size (config/model.py verify_with_parallel_config:
    attention heads divisible by TP; linear attention's heads too)."""
    if facts.num_attention_heads % tp:
        raise ModelConfigError(f"{facts.path}: num_attention_heads = {facts.num_attention_heads}; vLLM needs it "
                               f"divisible by --tensor-parallel-size {tp}")  # fmt: skip
    for key, heads in (("linear_num_key_heads", facts.linear_num_key_heads),
                       ("linear_num_value_heads", facts.linear_num_value_heads)):  # fmt: skip
        if heads % tp:
            raise ModelConfigError(f"{facts.path}: {key} = {heads}; vLLM needs it divisible by "
                                   f"--tensor-parallel-size {tp}")  # fmt: skip


def pad_vocab(vocab_size: int, tp: int, pad_to: int = 64) -> int:
    """Rows per TP rank of VocabParallelEmbedding / ParallelLMHead: the vocab padded to 64, split over TP."""
    padded = math.ceil(vocab_size / pad_to) * pad_to
    return math.ceil(padded / tp)
