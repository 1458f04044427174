"""The multimodal encoder's dummy run in the profile (vLLM 0.19.0's V1 runner, the published logs' release).

v1/worker/gpu_model_runner.py profile_run (0.19.0:5721), for a model with multimodal inputs, before the language
model's dummy run:

    mm_budget.get_modality_with_max_tokens()            the modality of most tokens per item (image here)
    max_mm_items_per_batch                              multimodal/encoder_budget.py MultiModalBudget._get_max_items
    batched_dummy_mm_inputs = _get_mm_dummy_batch(...)  one dummy item of the maximum feature size, repeated and
                                                        batched onto the GPU (multimodal/utils.py
                                                        group_and_batch_mm_kwargs: reduce_data on the CPU, then to the
                                                        device), its floating tensors in the model dtype
                                                        (multimodal/processing/context.py _postprocess_output)
    dummy_encoder_outputs = model.embed_multimodal(**batched_dummy_mm_inputs)
    self.encoder_cache[f"tmp_{i}"] = output             each item's embeddings, kept

and then `_dummy_run(max_num_tokens)` and the dummy sampler; `self.encoder_cache.clear()` comes after both, and
`batched_dummy_mm_inputs` is a local of profile_run. So through the language model's dummy forward and sampler the
torch peak holds, beyond the language model's own phases (harness.sizing.profile_run):

    inputs    the batched pixel values, items x the processor's output for one dummy item, in the model dtype
    outputs   the encoder cache: items x T embeddings of the text hidden size K, in the model dtype (each item's is a
              view of the projector's output, which stays whole)
    cached    what the tower caches on the device for the process at its first call (MoonViT's rope table)

and the encoder's own run peaks earlier, over its inputs, at the tower's largest layer point (an estimate below).
vLLM 0.26.0's V1 runner has the same encoder profile (gpu_model_runner.py:6412); its V2 runner, which runs the
non-MoE models there, has none (v1/worker/gpu/model_runner.py profile_run: `_dummy_run` and the sampler only).

The budget (multimodal/encoder_budget.py, v1/core/encoder_cache_manager.py compute_mm_encoder_budget): T = the
processor's maximum tokens per item; encoder budget = max(max_num_batched_tokens, T) (the compute budget and the
cache size are both max_num_batched_tokens, each raised to T); items = max(1, min(budget // T, max_num_seqs x
max(1, min(image limit, max_model_len // T)))) with chunked prefill on (the V1 default).

Per model (the processor's dummy item at its maximum feature size):
  Gemma 3 (gemma3_mm.py)      T = mm_tokens_per_image; one crop of image_size^2 (pan-and-scan is off by default:
                              Gemma3ProcessingInfo.get_num_crops returns 0)
  LLaVA-NeXT (llava_next.py)  the pinpoint of most features (get_image_size_with_most_features): T = base tokens +
                              the unpadded grid with a newline per row (get_num_image_tokens,
                              _get_num_unpadded_features); 1 + rows x columns tiles of image_size^2
  Llama-4 (mllama4.py)        a (max_patches x image_size, image_size) image: max_patches chunks and a global one;
                              T = chunks x (image_size / patch)^2 / round(1 / pixel_shuffle_ratio^2)
  Pixtral, Mistral 3          an image_size^2 image (pixtral.py get_image_size_with_most_features, mistral3.py):
                              (image_size / patch / spatial_merge)^2 image tokens (the break tokens get no embedding)
  Kimi-VL (kimi_vl.py)        a 1024^2 image (MaxImageTokenMeta) scaled under in_token_limit patches and padded to the
                              merge kernel (get_num_image_tokens); pixel values are its patches (T x merge^2, 3, p, p);
                              MoonViT's Rope2DPosEmb(head_dim, 512, 512) caches its (512, 512, head_dim / 2)
                              complex64 table on the device at the first call (moonvit.py precomputed_freqs_cis, a
                              cached_property)

The towers' attention in that release: Gemma 3's SigLIP, LLaVA-NeXT's SigLIP, Llama-4's and MoonViT's use
MMEncoderAttention, FLASH_ATTN on the H100 (the logs: "Using backend AttentionBackendEnum.FLASH_ATTN for vit
attention"), no score matrix; Pixtral's and Mistral 3's call torch's scaled_dot_product_attention with a block
diagonal (L, L) mask in the model dtype where xformers is absent (pixtral.py: "vLLM does not install xformers by
default"; transformers' generate_block_attention_mask), which is counted in their run's estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.sizing.model_config import ModelFacts, VisionTower

# Processor facts that are not in config.json, from the model's processor config:
#   Llama-4's image processor max_patches (Llama-4 Scout's image_processor_config: max_patches 16,
#   resize_to_max_canvas false; the Scout log's "profiled with 3 image items" is 8192 // (17 x 144))
#   Kimi-VL's KimiVLImageProcessor in_token_limit 4096, pad_input true (the Kimi-VL logs' "profiled with 7 image
#   items" is 8192 // 1089)
LLAMA4_MAX_PATCHES = 16
KIMI_IN_TOKEN_LIMIT = 4096
KIMI_DUMMY_SIDE = 1024  # kimi_vl.py MaxImageTokenMeta: width = height = 1024
MOONVIT_ROPE_SIDE = 512  # moonvit.py MoonVitEncoder: Rope2DPosEmb(head_dim, 512, 512)
COMPLEX64 = 8
DEFAULT_IMAGE_LIMIT = 999  # config/multimodal.py get_limit_per_prompt: 999 for a modality not given


@dataclass(frozen=True)
class EncoderProfile:
    """The profile's dummy encoder batch: what it holds through the language model's dummy run, and its own peak."""

    items: int
    tokens_per_item: int
    budget: int
    inputs: int  # the batched pixel values
    outputs: int  # the encoder cache
    cached: int  # what the tower keeps on the device from its first call
    run_peak: int  # the encoder run's own peak over what profile_run held before it (estimate)
    detail: str
    run_detail: str

    @property
    def held(self) -> int:
        return self.inputs + self.outputs + self.cached


@dataclass(frozen=True)
class _Item:
    tokens: int  # embeddings per item (T)
    pixels: int  # pixel-value elements per item
    sequence: int  # the tower's sequence per item (patches, with a class token where the tower has one)
    what: str


def _llava_tokens(v: VisionTower, height: int, width: int) -> tuple[int, int]:
    """(tokens, tiles) of a LLaVA-NeXT image the size of a pinpoint: llava_next.py get_num_image_tokens with
    transformers' get_anyres_image_grid_shape (an image of a pinpoint's size fits that pinpoint)."""
    side = v.image_size // v.patch_size
    # vision.py get_num_selected_vision_tokens: class 1, default all but the first, full all
    base = 1 if v.feature_select == "class" else side * side - (1 if v.feature_select == "default" else 0)
    rows, cols = height // v.image_size, width // v.image_size
    if not rows or not cols:  # a pinpoint smaller than a tile: no grid (taken as no features)
        return 0, 0
    cur_h, cur_w = side * rows, side * cols
    if width / height > cur_w / cur_h:  # _get_num_unpadded_features
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= 2 * ((cur_h - new_h) // 2)
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= 2 * ((cur_w - new_w) // 2)
    return cur_h * cur_w + cur_h + base, 1 + rows * cols


def _item(facts: ModelFacts) -> _Item | None:
    v = facts.vision
    if v is None:
        return None
    c = v.num_channels
    if v.kind == "siglip":  # Gemma 3
        side = v.image_size // v.patch_size
        return _Item(v.tokens_per_image, c * v.image_size**2, side * side,
                     f"one {v.image_size}^2 crop, {v.tokens_per_image} tokens (gemma3_mm.py)")  # fmt: skip
    if v.kind == "llava":
        best = max(v.pinpoints, key=lambda p: _llava_tokens(v, *p)[0])  # the first of the most, as vLLM's loop
        tokens, tiles = _llava_tokens(v, *best)
        if not tokens:
            return None
        side = v.image_size // v.patch_size
        return _Item(tokens, tiles * c * v.image_size**2, tiles * side * side,
                     f"the {best[0]}x{best[1]} pinpoint: {tiles} tiles of {v.image_size}^2, {tokens} tokens "
                     "(llava_next.py get_image_size_with_most_features)")  # fmt: skip
    if v.kind == "llama4":
        chunks = LLAMA4_MAX_PATCHES + 1 if LLAMA4_MAX_PATCHES > 1 else 1
        side = v.image_size // v.patch_size
        per_chunk = side * side // round(1.0 / v.pixel_shuffle_ratio**2)
        return _Item(chunks * per_chunk, chunks * c * v.image_size**2, chunks * (side * side + 1),
                     f"{chunks} chunks of {v.image_size}^2 (max_patches {LLAMA4_MAX_PATCHES} and the global one), "
                     f"{per_chunk} tokens each (mllama4.py)")  # fmt: skip
    if v.kind in ("pixtral", "pixtral_hf"):
        side = v.image_size // v.patch_size
        merged = side // v.merge
        return _Item(merged * merged, c * (side * v.patch_size) ** 2, side * side,
                     f"one {side * v.patch_size}^2 image, {merged}^2 tokens "
                     f"({'pixtral.py' if v.kind == 'pixtral' else 'mistral3.py'})")  # fmt: skip
    if v.kind == "moonvit":
        p, k = v.patch_size, v.merge
        width = height = KIMI_DUMMY_SIDE
        if (width // p) * (height // p) > KIMI_IN_TOKEN_LIMIT:
            scale = math.sqrt(KIMI_IN_TOKEN_LIMIT / ((width // p) * (height // p)))
            width, height = int(width * scale), int(height * scale)
        pad_h, pad_w = (k * p - height % (k * p)) % (k * p), (k * p - width % (k * p)) % (k * p)
        tokens = ((height + pad_h) // (k * p)) * ((width + pad_w) // (k * p))
        patches = tokens * k * k
        return _Item(tokens, patches * c * p * p, patches,
                     f"a {KIMI_DUMMY_SIDE}^2 image under {KIMI_IN_TOKEN_LIMIT} patches, padded to "
                     f"{height + pad_h}x{width + pad_w}: {patches} patches, {tokens} tokens (kimi_vl.py)")  # fmt: skip
    return None


def encoder_profile(facts: ModelFacts, *, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                    image_limit: int = DEFAULT_IMAGE_LIMIT) -> EncoderProfile | None:  # fmt: skip
    """The dummy encoder batch of profile_run for a model with a vision tower built (module docstring); None for a
    model without one, or a tower this module does not read."""
    item = _item(facts)
    v = facts.vision
    if item is None or v is None or item.tokens <= 0 or image_limit <= 0:
        return None
    T, d, K = item.tokens, facts.dtype_bytes, facts.hidden_size
    budget = max(max_num_batched_tokens, T)
    per_prompt = max(1, min(image_limit, max_model_len // T))
    items = max(1, min(budget // T, max_num_seqs * per_prompt))
    inputs = items * item.pixels * d
    outputs = items * T * K * d
    cached = 0
    cached_part = ""
    if v.kind == "moonvit" and v.num_heads:
        head_dim = v.hidden_size // v.num_heads
        cached = MOONVIT_ROPE_SIDE * MOONVIT_ROPE_SIDE * (head_dim // 2) * COMPLEX64
        cached_part = (f" + MoonViT's rope table ({MOONVIT_ROPE_SIDE}, {MOONVIT_ROPE_SIDE}, {head_dim // 2}) "
                       f"complex64 {cached} B")  # fmt: skip
    detail = (f"encoder cache {inputs + outputs + cached} B = the dummy batch's pixel values {items} x {item.pixels} "
              f"x {d} B + its embeddings {items} x ({T}, {K}) x {d} B{cached_part}: {items} items (encoder budget "
              f"{budget} tokens // {T}) of {item.what}, held through the language model's dummy run "
              "(v1/worker/gpu_model_runner.py profile_run: batched_dummy_mm_inputs, encoder_cache)")  # fmt: skip
    # The encoder run's own peak (estimate): its inputs, the layer's input and residual (L, H) and the MLP's
    # intermediates, 2 (L, F) (fc1 and its activation; 3 for the gated MLP of Pixtral and Mistral 3: w1's activation,
    # w3 and their product), and for Pixtral and Mistral 3 the (L, L) attention mask; L the batch's whole sequence
    L, H, F = items * item.sequence, v.hidden_size, v.intermediate_size
    gated = v.kind in ("pixtral", "pixtral_hf")
    mask = L * L * d if gated else 0
    run = inputs + cached + 2 * L * H * d + (3 if gated else 2) * L * F * d + mask
    run_detail = (f"encoder run {run} B = the pixel values + 2 x (L={L}, {H}) + {3 if gated else 2} x (L, {F}) x {d} B"
                  f"{f' + the (L, L) attention mask {mask} B' if mask else ''}{' + the rope table' if cached else ''} "
                  "(estimate, unsharded)")  # fmt: skip
    return EncoderProfile(items=items, tokens_per_item=T, budget=budget, inputs=inputs, outputs=outputs,
                          cached=cached, run_peak=run, detail=detail, run_detail=run_detail)  # fmt: skip
