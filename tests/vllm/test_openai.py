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


def test_the_models_text_comes_back_plain_and_streamed(server, urls):
    out = chat(server, urls[1])
    assert out.choices[0].message.content == VARIANTS[1].markdown
    assert out.choices[0].finish_reason == "stop"
    chunks = list(chat(server, urls[1], stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == VARIANTS[1].markdown
    [model] = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key).models.list()
    assert model.owned_by == "ocrfleet-vllm" and model.model_extra["engine"] == "vllm"


def test_images_are_read_in_order_and_a_cut_page_ends_as_length(server, urls):
    out = chat(server, urls[2], urls[0])
    assert out.choices[0].message.content == VARIANTS[2].markdown + "\n\n---\n\n" + VARIANTS[0].markdown
    cut = chat(server, urls[0], max_tokens=5)
    assert cut.choices[0].finish_reason == "length"
    text = cut.choices[0].message.content
    assert VARIANTS[0].markdown.startswith(text) and len(text) < len(VARIANTS[0].markdown)
