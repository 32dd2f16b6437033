"""A tiny LightOnOCR-2 checkpoint for the vLLM engine's tests, built in seconds on a CPU.

The layout is LightOnOCR-2-1B's: `config.json` with `model_type: mistral3` and
`architectures: [LightOnOCRForConditionalGeneration]`, a Pixtral vision encoder, a Qwen3 decoder, a
Pixtral processor (longest edge 1540, patch 14, merge 2), a byte-level BPE tokenizer (trained here,
offline) with Qwen's special tokens, and a chat template of the model's kind: a system turn, then one
user turn holding only `<|image_pad|>`, then the assistant's turn. Weights are those transformers'
`LightOnOcrForConditionalGeneration` saves (`model.vision_encoder.*`, ...), which vLLM remaps.

The weights start random (hidden 64, 2 layers) and are then fitted for 800 steps so that
the model reads a page drawn by `page(v)` as VARIANTS[v].markdown, and stops. Each variant has its own
lines and background colour: the frozen random vision encoder tells the colours apart at any size, so
the answer depends on the page (pages swapped inside a document, or answers crossed between requests,
show), and a blank white page reads as variant 0. That makes the output checkable: the
engine's text, lines, confidences and grounding can be asserted, and a `max_tokens` below its length
produces the `length` finish that loop detection must catch.

It also reads one table page, drawn by `table_page()` on its own colour, as TABLE_MARKDOWN: a heading
and an HTML table with a rowspan and a colspan, a cell a line, as LightOnOCR writes tables (its answer
is longer than the server's default max_tokens: ask for more). The table page is not one of VARIANTS:
every variant's page is lines of text, each line grounded on its own drawn box.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    lines: tuple[str, ...]
    background: tuple[int, int, int]  # light enough for the grounding detector to read the text

    @property
    def markdown(self) -> str:
        return f"# {self.lines[0]}\n\n" + "\n".join(self.lines[1:])


VARIANTS = (
    Variant(
        ("Northwind Traders", "Invoice 2024-0193", "Ship to: 42 Harbour Road, Portsmouth"), (255, 255, 255)
    ),
    Variant(
        ("Contoso Pharmaceuticals", "Invoice 2025-0207", "Ship to: 7 Mill Lane, Exeter"), (190, 215, 255)
    ),
    Variant(("Fabrikam Fabrics", "Invoice 2023-0311", "Ship to: 15 Quay Street, Bristol"), (255, 225, 160)),
)


@dataclass(frozen=True)
class TableCell:
    """A cell of TABLE_MARKDOWN's table as placed on its grid, by hand."""

    text: str
    row: int
    column: int
    row_span: int = 1
    column_span: int = 1


TABLE_TITLE = "Packing list"
TABLE_BACKGROUND = (200, 240, 200)
# Written out, a cell a line (the engine boxes a cell whose line holds it alone).
TABLE_MARKDOWN = f"""# {TABLE_TITLE}

<table>
<tr>
<th rowspan="2">Item</th>
<th colspan="2">Quantity</th>
<th rowspan="2">Price</th>
</tr>
<tr>
<th>Ordered</th>
<th>Shipped</th>
</tr>
<tr>
<td>Anchor chain</td>
<td>120</td>
<td>96</td>
<td>48.00</td>
</tr>
</table>"""
# Its grid, by hand: the spans move `Price` to column 3 and `Ordered` to column 1.
TABLE_ROWS, TABLE_COLUMNS = 3, 4
TABLE_CELLS = (
    TableCell("Item", 0, 0, row_span=2),
    TableCell("Quantity", 0, 1, column_span=2),
    TableCell("Price", 0, 3, row_span=2),
    TableCell("Ordered", 1, 1),
    TableCell("Shipped", 1, 2),
    TableCell("Anchor chain", 2, 0),
    TableCell("120", 2, 1),
    TableCell("96", 2, 2),
    TableCell("48.00", 2, 3),
)


@dataclass
class TablePage:
    image: object  # PIL.Image.Image
    title_box: tuple[float, float, float, float]
    cell_boxes: list[tuple[float, float, float, float]]  # pixel boxes of each cell's drawn text
    cell_rules: list[tuple[int, int, int, int]]  # pixel boxes of each cell's ruled frame


def table_page(size: int = 40, width: int = 1400, margin: int = 60) -> TablePage:
    """The table page: TABLE_TITLE above TABLE_CELLS drawn ruled on their grid, each text centred in its
    cell, tinted TABLE_BACKGROUND."""
    from PIL import Image, ImageChops, ImageDraw

    from tests.docs import font_for

    font = font_for("en", size)
    shares = (0.34, 0.22, 0.22, 0.22)  # of the table's width, per column
    inner = width - 2 * margin
    xs = [margin + round(inner * sum(shares[:c])) for c in range(TABLE_COLUMNS + 1)]
    row_h = int(size * 2.2)
    top = margin + int(size * 2.2)
    ys = [top + r * row_h for r in range(TABLE_ROWS + 1)]
    image = Image.new("RGB", (width, ys[-1] + margin), "white")
    draw = ImageDraw.Draw(image)
    draw.text((margin, margin), TABLE_TITLE, fill="black", font=font)
    title_box = draw.textbbox((margin, margin), TABLE_TITLE, font=font)
    boxes, rules = [], []
    for c in TABLE_CELLS:
        x0, x1 = xs[c.column], xs[c.column + c.column_span]
        y0, y1 = ys[c.row], ys[c.row + c.row_span]
        draw.rectangle((x0, y0, x1, y1), outline=(90, 90, 90), width=2)
        rules.append((x0, y0, x1, y1))
        at = ((x0 + x1) / 2, (y0 + y1) / 2)
        draw.text(at, c.text, fill="black", font=font, anchor="mm")
        boxes.append(draw.textbbox(at, c.text, font=font, anchor="mm"))
    image = ImageChops.multiply(image, Image.new("RGB", image.size, TABLE_BACKGROUND))
    return TablePage(image, title_box, boxes, rules)


def page(variant: int, **render_args):
    """Variant `variant`'s page: its lines as tests/docs.render draws them (boxes included), tinted."""
    from PIL import Image, ImageChops

    from tests.docs import render

    v = VARIANTS[variant]
    rendered = render(list(v.lines), **render_args)
    rendered.image = ImageChops.multiply(rendered.image, Image.new("RGB", rendered.image.size, v.background))
    return rendered


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
    *(line for v in VARIANTS for line in v.lines),
    *(v.markdown for v in VARIANTS),
    TABLE_MARKDOWN,
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


TABLE_SIZES = [(40, 1400), (32, 1140)]


def _training_pages():
    """(image, target) pairs: each variant's page at the tests' size and the benchmark's, and blank (the
    target: the variant's index), and the table page (target len(VARIANTS)).

    From ~220 image tokens to ~720 (a 1540-px-wide strip); a blank page of each colour keeps the
    answer on the colour, not on the text. Fewer sizes fit too, but then small pages lose lines.
    """
    from PIL import Image

    pages = []
    # Variants interleaved: fitted one after another, each would undo the last one's fit.
    for size, width in [(40, 1400), (28, 900), (32, 1140), (36, 1020), (40, 1540), (24, 700)]:
        pages += [(page(v, size=size, width=width).image, v) for v in range(len(VARIANTS))]
    for w, h in [(700, 300), (392, 532)]:
        pages += [(Image.new("RGB", (w, h), v.background), i) for i, v in enumerate(VARIANTS)]
    # The table's answer is ~7x a variant's: its page comes after every 4th of the others, to fit in time.
    tables = [(table_page(size=size, width=width).image, len(VARIANTS)) for size, width in TABLE_SIZES]
    mixed = []
    for k, sample in enumerate(pages):
        mixed.append(sample)
        if k % 4 == 3:
            mixed.append(tables[(k // 4) % len(tables)])
    return mixed


def cached(out: Path, steps: int = 800, seed: int = 0) -> Path:
    """build()'s checkpoint copied into `out` from the vLLM tests' cache (venv.cache_root()), built there
    first when its recipe has no entry yet. An entry's key is the recipe: this file, tests/docs.py (which
    draws the pages), steps, seed and the versions of the libraries that train and render. An entry is
    whole or absent: built beside it, then renamed into place."""
    import hashlib
    import shutil
    import tempfile
    from importlib.metadata import version

    from tests.vllm.venv import cache_root

    here = Path(__file__)
    recipe = hashlib.sha256()
    for source in (here, here.parents[1] / "docs.py"):
        recipe.update(source.read_bytes())
    for dist in ("torch", "transformers", "tokenizers", "pillow"):
        recipe.update(f"{dist}=={version(dist)}".encode())
    recipe.update(f"steps={steps} seed={seed}".encode())
    root = cache_root()
    entry = root / f"tiny-lightonocr-{recipe.hexdigest()[:16]}"
    if not entry.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tiny-lightonocr-", dir=root))
        try:
            build(staging / "model", steps, seed)
            try:
                (staging / "model").rename(entry)
            except OSError:  # another run put the same recipe there first
                if not entry.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(entry, out)
    return out


def build(out: Path, steps: int = 800, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created) and return it."""
    import torch

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation, and the CPUs are shared
    try:
        return _build(out, steps, torch)
    finally:
        torch.set_num_threads(threads)


def _build(out: Path, steps: int, torch) -> Path:
    from transformers import AutoImageProcessor, LightOnOcrConfig, LightOnOcrForConditionalGeneration

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
    model = LightOnOcrForConditionalGeneration(config)
    _fit(model, tokenizer, AutoImageProcessor.from_pretrained(out), image_token_id, steps, torch)
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
    return out


def _fit(model, tokenizer, processor, image_token_id: int, steps: int, torch) -> None:
    """Teach the decoder to answer each training page with its variant's markdown, then <|im_end|>.

    The vision encoder and projector stay as initialised (vLLM computes the same image features from
    them, from the same image processor's pixels), so each training page's features are computed
    once and only the decoder is trained.
    """
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}]}], tokenize=False, add_generation_prompt=True
    )
    before, after = prompt_text.split("<|image_pad|>")
    head = tokenizer.encode(before, add_special_tokens=False)
    tail = tokenizer.encode(after, add_special_tokens=False)
    answers = [*(v.markdown for v in VARIANTS), TABLE_MARKDOWN]
    targets = [tokenizer.encode(a + "<|im_end|>", add_special_tokens=False) for a in answers]
    vision = (model.model.vision_encoder, model.model.vision_projection)
    for part in vision:
        part.requires_grad_(False)
    embed = model.get_input_embeddings()
    samples = []
    for image, variant in _training_pages():
        pixels = processor(images=[image], return_tensors="pt")
        with torch.no_grad():
            features = model.model.get_image_features(
                pixel_values=pixels["pixel_values"], image_sizes=pixels["image_sizes"]
            ).pooler_output
        features = torch.cat(features).unsqueeze(0)
        target = targets[variant]
        ids = torch.tensor([head + [image_token_id] * features.shape[1] + tail + target])
        labels = torch.full_like(ids, -100)
        labels[0, -len(target) :] = torch.tensor(target)
        samples.append((ids, labels, features))
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
        raise RuntimeError(f"tiny model did not fit its pages (losses {[round(x, 3) for x in losses]})")


if __name__ == "__main__":
    import sys
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for tests.docs, run as a script
    t = time.perf_counter()
    print(build(Path(sys.argv[1])), f"{time.perf_counter() - t:.1f}s")
