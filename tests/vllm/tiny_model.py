"""A tiny LightOnOCR-2 checkpoint for the vLLM engine's tests, built in seconds on a CPU.

The layout is LightOnOCR-2-1B's: `config.json` with `model_type: mistral3` and
`architectures: [LightOnOCRForConditionalGeneration]`, a Pixtral vision encoder, a Qwen3 decoder, a
Pixtral processor (longest edge 1540, patch 14, merge 2), a byte-level BPE tokenizer (trained here,
offline) with Qwen's special tokens, and a chat template of the model's kind: a system turn, then one
user turn holding only `<|image_pad|>`, then the assistant's turn. Weights are those transformers'
`LightOnOcrForConditionalGeneration` saves (`model.vision_encoder.*`, ...), which vLLM remaps.

The weights start random (hidden 64, 2 layers) and are then fitted for a few hundred steps so that,
whatever the image, the model writes PAGE_MARKDOWN and stops. That makes its output checkable: the
engine's text, lines, confidences and grounding can be asserted, and a `max_tokens` below its length
produces the `length` finish that loop detection must catch.
"""

from __future__ import annotations

import json
from pathlib import Path

PAGE_LINES = ["Northwind Traders", "Invoice 2024-0193", "Ship to: 42 Harbour Road, Portsmouth"]
PAGE_MARKDOWN = f"# {PAGE_LINES[0]}\n\n{PAGE_LINES[1]}\n{PAGE_LINES[2]}"

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|image_pad|>",
    "<|vision_pad|>",
    "<|vision_end|>",
    "<|vision_start|>",
]
PATCH = 14
MERGE = 2
LONGEST_EDGE = 1540

# Written for these tests in the form of LightOnOCR's template (the image only, no instruction).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}{{ '<|image_pad|>' }}"
    "{%- elif 'text' in part -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

CORPUS = [
    *PAGE_LINES,
    PAGE_MARKDOWN,
    "Subtotal 1,250.00 GBP and VAT 250.00 GBP",
    "Payment due within thirty days of receipt",
    "<table><tr><td>Item</td><td>Qty</td></tr></table>",
    "$E = mc^2$ | **bold** _italic_ - [x] 0123456789",
]


def _tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # noqa: S106 - a token, not a password
        pad_token="<|endoftext|>",  # noqa: S106
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=16384,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return fast


def _pixels(image, torch):
    """The image as the Pixtral processor feeds it: RGB, scaled to [0, 1], CLIP-normalised."""
    import numpy as np

    arr = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    mean = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
    std = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
    return torch.from_numpy(((arr - mean) / std).transpose(2, 0, 1)).unsqueeze(0)


def _training_images(seed: int):
    """Pages of varied sizes and contents; sides are multiples of patch x merge (28)."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    images = []
    # From the warm-up sample's ~90 image tokens to the test pages' ~800 (a 1540-px-wide text strip).
    for w, h in [(644, 112), (280, 392), (392, 280), (560, 336), (1400, 364), (1540, 420), (700, 980)]:
        im = Image.new("RGB", (w, h), tuple(rng.randrange(200, 256) for _ in range(3)))
        draw = ImageDraw.Draw(im)
        for _ in range(6):
            x, y = rng.randrange(w), rng.randrange(h)
            draw.rectangle((x, y, x + rng.randrange(8, 80), y + rng.randrange(4, 20)), fill=(0, 0, 0))
        images.append(im)
    return images


def build(out: Path, steps: int = 210, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created) and return it."""
    import torch

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation, and the CPUs are shared
    try:
        return _build(out, steps, seed, torch)
    finally:
        torch.set_num_threads(threads)


def _build(out: Path, steps: int, seed: int, torch) -> Path:
    from transformers import LightOnOcrConfig, LightOnOcrForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(out)
    image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    vocab = len(tokenizer)

    vision = dict(
        model_type="pixtral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=32,
        num_channels=3,
        image_size=LONGEST_EDGE,
        patch_size=PATCH,
        hidden_act="silu",
        rope_theta=10000.0,
    )
    text = dict(
        model_type="qwen3",
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # vLLM's CPU attention kernels start at 32
        max_position_embeddings=16384,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    config = LightOnOcrConfig(
        vision_config=vision, text_config=text, image_token_id=image_token_id, spatial_merge_size=MERGE
    )
    model = LightOnOcrForConditionalGeneration(config)
    _fit(model, tokenizer, image_token_id, steps, seed, torch)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)

    # vLLM serves LightOnOCR from a Mistral3-style config (as the published checkpoint has it).
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(
        architectures=["LightOnOCRForConditionalGeneration"],
        model_type="mistral3",
        image_token_index=image_token_id,
        projector_hidden_act="gelu",
        multimodal_projector_bias=False,
        vision_feature_layer=-1,
        spatial_merge_size=MERGE,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    cfg.pop("image_token_id", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos, "pad_token_id": eos[1], "temperature": 0.2, "top_p": 0.9})
    )
    processor = {
        "processor_class": "PixtralProcessor",
        "image_token": "<|image_pad|>",
        "image_break_token": "<|vision_pad|>",
        "image_end_token": "<|vision_end|>",
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
    preprocessor = {
        "image_processor_type": "PixtralImageProcessorFast",
        "processor_class": "PixtralProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": PATCH,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": LONGEST_EDGE},
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    return out


def _fit(model, tokenizer, image_token_id: int, steps: int, seed: int, torch) -> None:
    """Teach the decoder to answer every page with PAGE_MARKDOWN, then <|im_end|>.

    The vision encoder and projector stay as initialised (vLLM computes the same image features from
    them), so each training page's features are computed once and only the decoder is trained.
    """
    target = tokenizer.encode(PAGE_MARKDOWN + "<|im_end|>", add_special_tokens=False)
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}]}], tokenize=False, add_generation_prompt=True
    )
    before, after = prompt_text.split("<|image_pad|>")
    head = tokenizer.encode(before, add_special_tokens=False)
    tail = tokenizer.encode(after, add_special_tokens=False)
    vision = (model.model.vision_encoder, model.model.vision_projection)
    for part in vision:
        part.requires_grad_(False)
    embed = model.get_input_embeddings()
    samples = []
    for image in _training_images(seed):
        n = (image.height // (PATCH * MERGE)) * (image.width // (PATCH * MERGE))
        ids = torch.tensor([head + [image_token_id] * n + tail + target])
        labels = torch.full_like(ids, -100)
        labels[0, -len(target) :] = torch.tensor(target)
        with torch.no_grad():
            features = model.model.get_image_features(
                pixel_values=_pixels(image, torch), image_sizes=torch.tensor([[image.height, image.width]])
            ).pooler_output
        samples.append((ids, labels, torch.cat(features).unsqueeze(0)))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
    losses = [9.9] * len(samples)
    for step in range(steps):
        k = step % len(samples)
        ids, labels, features = samples[k]
        embeds = embed(ids)
        embeds = embeds.masked_scatter((ids == image_token_id).unsqueeze(-1), features)
        loss = model(inputs_embeds=embeds, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[k] = loss.item()
    model.eval()
    if max(losses) > 0.05:
        raise RuntimeError(f"tiny model did not fit its page (losses {[round(x, 3) for x in losses]})")


if __name__ == "__main__":
    import sys
    import time

    t = time.perf_counter()
    print(build(Path(sys.argv[1])), f"{time.perf_counter() - t:.1f}s")
