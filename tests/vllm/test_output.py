"""The vllm engine's answer handling, as functions: loops, line confidences, grounding's alignment."""

from __future__ import annotations

import math

from ocr_app.engines.base import EngineLine
from ocr_app.engines.vllm.grounding import align, normalise
from ocr_app.engines.vllm.output import (
    Attempt,
    LiveText,
    Loop,
    find_loop,
    line_confidences,
    markdown_blocks,
    page_warnings,
)


def test_find_loop_finds_the_earliest_long_run():
    head = list(range(100, 150))
    unit = [7, 8, 9]
    tokens = head + unit * 40 + [1, 2]
    loop = find_loop(tokens, max_ngram=8, min_repeats=8, min_tokens=24)
    assert loop == Loop(start=50, period=3, repeats=40) and loop.keep == 53
    # Below the thresholds: a short repetition, or one longer than max_ngram, is text.
    assert find_loop(tokens, max_ngram=8, min_repeats=41, min_tokens=24) is None
    assert find_loop(tokens, max_ngram=8, min_repeats=8, min_tokens=200) is None
    assert find_loop(head + list(range(20)) * 10, max_ngram=8, min_repeats=4, min_tokens=8) is None
    assert find_loop(head + [5] * 30, max_ngram=4, min_repeats=10, min_tokens=10) == Loop(50, 1, 30)
    assert find_loop([], 8, 2, 2) is None


def test_table_rows_are_not_a_loop_at_the_defaults():
    # An HTML table of 12 identical empty rows (~10 tokens each) is legitimate output.
    row = [11, 12, 13, 14, 13, 14, 13, 14, 15, 16]
    assert find_loop(list(range(200, 260)) + row * 12, max_ngram=64, min_repeats=8, min_tokens=256) is None


def test_line_confidences_are_geometric_means_per_line():
    text = "# Title\n\nab c\n"
    pieces = ["#", " Title", "\n\n", "ab", " c", "\n"]
    lps = [math.log(0.9), math.log(0.9), math.log(0.5), math.log(0.8), math.log(0.2), math.log(1.0)]
    out = line_confidences(text, pieces, lps)
    assert [t for t, _ in out] == ["# Title", "ab c"]
    assert out[0][1] == round((0.9 * 0.9 * 0.5) ** (1 / 3), 4)
    assert out[1][1] == round((0.8 * 0.2 * 1.0) ** (1 / 3), 4)
    assert line_confidences("x", ["x"], [float("nan")]) == [("x", 0.0)]


def test_warnings_name_the_problem_first():
    a = Attempt(0.2, [1] * 5, [0.0] * 5, ["a"] * 5, "length", problem="max_tokens_reached")
    b = Attempt(0.5, [1] * 300, [0.0] * 300, ["a"] * 300, "length", "repetition_loop", Loop(10, 2, 145))
    w = page_warnings(b, [a, b])
    assert [x.split(":")[0] for x in w] == ["retried", "repetition_loop"]
    assert "max_tokens_reached at temperature 0.2" in w[0] and "12 of 300 tokens kept" in w[1]
    assert page_warnings(a, [a]) == ["max_tokens_reached: the page is cut at 5 tokens"]


def line(text, box):
    return EngineLine(text=text, bbox=box, confidence=0.9)


def test_align_matches_markdown_lines_to_detected_boxes():
    detected = [
        line("Northwind Traders", (0.1, 0.1, 0.5, 0.15)),
        line("Invoice 2O24-0193", (0.1, 0.2, 0.4, 0.25)),  # a misread character
        line("Item", (0.1, 0.3, 0.2, 0.35)),
        line("Qty", (0.6, 0.3, 0.7, 0.35)),
        line("Total due 250.00 GBP", (0.1, 0.4, 0.6, 0.45)),
    ]
    model = [
        "# Northwind Traders",
        "Invoice 2024-0193",
        "<table><tr><td>Item</td><td>Qty</td></tr></table>",
        "**Total due**",
        "Something the detector never saw",
    ]
    assert align(model, detected) == [
        (0.1, 0.1, 0.5, 0.15),
        (0.1, 0.2, 0.4, 0.25),
        (0.1, 0.3, 0.7, 0.35),  # the row: both cells' union
        (0.1, 0.4, 0.6, 0.45),  # part of a longer detected line: that line's box
        None,
    ]
    assert align(model, []) == [None] * 5


def test_align_uses_each_detected_line_once_for_repeated_lines():
    detected = [line("Total", (0, 0.1, 0.2, 0.2)), line("Total", (0, 0.5, 0.2, 0.6))]
    assert align(["Total", "Total"], detected) == [(0, 0.1, 0.2, 0.2), (0, 0.5, 0.2, 0.6)]


def test_normalise_drops_markup():
    assert normalise("## **Prix** : $x^2$ <b>net</b>  ![logo](a.png)") == "prix : x 2 net"


def test_markdown_blocks_follow_the_models_structure():
    text = (
        "# Quarterly report\n## Sales\nRevenue grew in\nevery region.\n\nCosts fell.\n"
        "- north\n- south\n\n<table><tr><td>a</td></tr>\n\n<tr><td>b</td></tr></table>\n\n"
        "| x | y |\n\n$$\nE = mc^2\n$$\n![chart](figure-1)\nSee above.\n"
    )
    blocks = markdown_blocks(text)
    assert blocks == [
        ("title", [0]),
        ("title", [1]),
        ("text", [2, 3]),
        ("text", [4]),
        ("list", [5, 6]),
        ("table", [7, 8]),
        ("table", [9]),
        ("formula", [10, 11, 12]),
        ("figure", [13]),
        ("text", [14]),
    ]
    # The indices are those of the engine's lines: the non-blank lines, as line_confidences gives them.
    lines = line_confidences(text, [text], [0.0])
    assert [i for _, idx in blocks for i in idx] == list(range(len(lines)))
    assert markdown_blocks("") == [] and markdown_blocks("\n\n") == []


def live(max_ngram=8, min_repeats=8, min_tokens=24):
    """A LiveText over byte tokens (a token is a byte: UTF-8 characters span tokens), and what it sent."""
    sent: list[str] = []
    text = LiveText(
        lambda ids: bytes(ids).decode("utf-8", "replace"), sent.append, max_ngram, min_repeats, min_tokens
    )
    return text, sent


def test_live_text_sends_as_written_but_no_loop_past_its_first_copy():
    head = b"Total: 12\n"
    text, sent = live()
    for b in head + b"ab" * 40 + b"\nafter the loop":
        text.feed([b])
    # find_loop keeps the text before the loop and one copy of it ("ab"); nothing after that was sent.
    assert "".join(sent) == "Total: 12\nab" and text.looped
    assert len(sent) > 3  # piece by piece, as written
    # Below the loop's thresholds a repetition is text: held while it goes on, sent once it ends.
    text, sent = live()
    for b in b"x" + b"ab" * 5:
        text.feed([b])
    assert "".join(sent) == "xab"
    text.feed(b"c")
    assert "".join(sent) == "xababababab" + "c" and not text.looped


def test_live_text_is_a_prefix_of_the_stripped_page_at_every_step():
    page = "\n\n# Caf\u00e9 \u20ac 5\n\nline two  \n"
    text, sent = live()
    for i, b in enumerate(page.encode()):
        text.feed([b])
        assert page.strip().startswith("".join(sent)), i
        assert "\ufffd" not in "".join(sent)  # a character split across tokens waits for its last byte
    assert "".join(sent) == page.strip()
