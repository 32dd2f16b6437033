"""POST /v1/chat/completions on the vllm engine, through OpenAI's client (the one vLLM itself pulls in): the
model's own text back, plain and streamed, pages in the order sent, and a page cut at max_tokens ending as
`length`. The tiny checkpoint reads a page drawn by tiny_model.page(v) as VARIANTS[v].markdown."""

from __future__ import annotations

import base64

import openai
import pytest

from ..docs import encode
from .tiny_model import VARIANTS, page

# The session's server (tests/vllm/conftest.py) may be started by this module: ~1 min on 2 idle cores.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def urls() -> list[str]:
    return [
        "data:image/png;base64," + base64.b64encode(encode(page(v).image, "PNG")).decode()
        for v in range(len(VARIANTS))
    ]


def chat(server, *urls: str, **options):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0, timeout=600)
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return client.chat.completions.create(
        model="lightonai/LightOnOCR-2-1B", messages=[{"role": "user", "content": content}], **options
    )


def content(chunks) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def test_the_models_text_comes_back_plain_and_streamed_as_written(server, urls):
    out = chat(server, urls[1], temperature=0)
    assert out.choices[0].message.content == VARIANTS[1].markdown
    assert out.choices[0].finish_reason == "stop"
    chunks = list(chat(server, urls[1], temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = content(chunks)
    assert "".join(pieces) == out.choices[0].message.content
    # As the model writes it: more pieces than the page has lines (a page read whole goes a line a piece).
    assert len(pieces) > len(VARIANTS[1].markdown.splitlines()), pieces
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-2].model_extra == {}
    assert chunks[-1].choices == [] and chunks[-1].usage == out.usage
    [model] = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key).models.list()
    assert model.owned_by == "ocrfleet-vllm" and model.model_extra["engine"] == "vllm"


def test_images_are_read_in_order_and_a_cut_page_ends_as_length(server, urls):
    out = chat(server, urls[2], urls[0])
    assert out.choices[0].message.content == VARIANTS[2].markdown + "\n\n---\n\n" + VARIANTS[0].markdown
    cut = chat(server, urls[0], max_tokens=5)
    assert cut.choices[0].finish_reason == "length"
    text = cut.choices[0].message.content
    assert VARIANTS[0].markdown.startswith(text) and len(text) < len(VARIANTS[0].markdown)
    # Streamed, the cut page (run again at each retry temperature, all cut) ends as `length` too.
    chunks = list(chat(server, urls[0], max_tokens=5, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(content(chunks)) == text


def test_usage_counts_the_tokens_the_model_wrote(server, urls, tiny_checkpoint):
    # The model writes VARIANTS[1].markdown: its tokens as the checkpoint's own tokenizer (transformers) reads
    # them, and the end-of-sequence token. Every page's tokens add up; the stream's usage chunk is the same.
    from transformers import AutoTokenizer

    written = len(
        AutoTokenizer.from_pretrained(tiny_checkpoint)(
            VARIANTS[1].markdown, add_special_tokens=False
        ).input_ids
    )
    one = chat(server, urls[1]).usage
    assert written <= one.completion_tokens <= written + 1, (written, one)
    assert one.prompt_tokens > 0 and one.total_tokens == one.prompt_tokens + one.completion_tokens
    two = chat(server, urls[1], urls[1]).usage
    assert (two.prompt_tokens, two.completion_tokens) == (2 * one.prompt_tokens, 2 * one.completion_tokens)
    chunks = list(chat(server, urls[1], stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == one
