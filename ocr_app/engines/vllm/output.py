"""The model's answer read and judged: repetition loops, each line's confidence from its tokens'
log-probabilities, the blocks of its Markdown, and the warnings a page carries when an answer was
degenerate."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Loop:
    start: int  # index of the first token of the repeated run
    period: int  # tokens in the repeated n-gram
    repeats: int  # whole copies in a row

    @property
    def keep(self) -> int:
        """Tokens to keep: everything before the run and one copy of the n-gram."""
        return self.start + self.period


def find_loop(tokens: list[int], max_ngram: int, min_repeats: int, min_tokens: int) -> Loop | None:
    """The earliest run of one n-gram (<= max_ngram tokens) repeated >= min_repeats times in a row
    over >= min_tokens tokens; None if there is none."""
    a = np.asarray(tokens, dtype=np.int64)
    best: Loop | None = None
    for p in range(1, min(max_ngram, len(a) // min_repeats) + 1):
        same = np.concatenate(([False], a[p:] == a[:-p], [False]))  # same[i + 1]: a[i + p] == a[i]
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        starts, ends = edges[::2], edges[1::2]  # runs of `same`: a[s .. e + p) has period p
        covered = ends - starts + p
        ok = np.flatnonzero((covered >= min_tokens) & (covered // p >= min_repeats))
        if ok.size:
            k = ok[0]
            start = int(starts[k])
            if best is None or start < best.start:
                best = Loop(start=start, period=p, repeats=int(covered[k] // p))
    return best


def line_confidences(text: str, pieces: list[str], logprobs: list[float]) -> list[tuple[str, float]]:
    """The non-blank lines of `text` with the geometric mean probability of their tokens.

    `pieces` are the tokens' own texts (to find where lines end), `logprobs` their log-probabilities.
    A token holding a newline counts towards the line it ends.
    """
    per_line: list[list[float]] = [[]]
    for piece, lp in zip(pieces, logprobs, strict=True):
        per_line[-1].append(lp)
        per_line.extend([] for _ in range(piece.count("\n")))
    out = []
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        lps = [lp for lp in (per_line[i] if i < len(per_line) else []) if math.isfinite(lp)]
        conf = math.exp(sum(lps) / len(lps)) if lps else 0.0
        out.append((line.rstrip(), round(min(1.0, max(0.0, conf)), 4)))
    return out


_LIST_ITEM = re.compile(r"([-*+]|\d+[.)])\s")


def markdown_blocks(text: str) -> list[tuple[str, list[int]]]:
    """(type, indices among the non-blank lines) of each block of the model's Markdown, in order.

    A blank line ends a block, except inside an HTML table or a $$ formula; consecutive lines of one kind
    form one block (a heading is a block of its own): `#` headings are titles, HTML or pipe tables tables,
    list items lists, $$ display maths formulas, ![...] images figures, the rest text.
    """
    blocks: list[tuple[str, list[int]]] = []
    index, previous, inside = -1, None, None  # inside: "table" or "formula" while one is open
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            previous = inside  # a blank line ends a block, but not an open table or formula
            continue
        index += 1
        if inside == "table":
            kind, inside = "table", None if "</table>" in line else "table"
        elif inside == "formula":
            kind, inside = "formula", None if line.endswith("$$") else "formula"
        elif line.startswith("<table"):
            kind, inside = "table", None if "</table>" in line else "table"
        elif line.startswith("$$"):
            kind, inside = "formula", None if len(line) > 2 and line.endswith("$$") else "formula"
        elif line.startswith("#"):
            kind = "title"
        elif line.startswith("|"):
            kind = "table"
        elif _LIST_ITEM.match(line):
            kind = "list"
        elif line.startswith("!["):
            kind = "figure"
        else:
            kind = "text"
        if blocks and kind == previous and kind != "title":
            blocks[-1][1].append(index)
        else:
            blocks.append((kind, [index]))
        previous = kind
    return blocks


@dataclass
class Attempt:
    temperature: float
    token_ids: list[int]
    logprobs: list[float]
    pieces: list[str]
    finish_reason: str | None
    problem: str | None = None  # None | "max_tokens_reached" | "repetition_loop"
    loop: Loop | None = None
    prompt_tokens: int = 0  # the prompt's tokens, the page's image tokens among them
    generated: int = 0  # every token the model wrote, special ones included

    @property
    def kept(self) -> int:
        return self.loop.keep if self.loop else len(self.token_ids)


def page_warnings(best: Attempt, attempts: list[Attempt]) -> list[str]:
    """`code: detail` strings; clients match on the code before the colon."""
    out = []
    if len(attempts) > 1:
        tried = ", ".join(f"{a.problem} at temperature {a.temperature:g}" for a in attempts if a.problem)
        out.append(f"retried: {len(attempts) - 1} retries after degenerate output ({tried})")
    if best.problem == "repetition_loop":
        loop = best.loop
        assert loop is not None  # the problem is the loop found
        out.append(
            f"repetition_loop: a {loop.period}-token sequence repeated {loop.repeats} times; "
            f"the page is cut after its first occurrence ({loop.keep} of {len(best.token_ids)} tokens kept)"
        )
    elif best.problem == "max_tokens_reached":
        out.append(f"max_tokens_reached: the page is cut at {len(best.token_ids)} tokens")
    return out


class LiveText:
    """A page's text for a stream, as the model writes it: each new piece goes to `sink` once it is settled.

    What it sends joins into a prefix of the page's text as the engine returns it (decoded, stripped), with
    two things held back: an incomplete character (a token that ends inside one), and every token that
    repeats the one `p` tokens before it in a run still going on (p up to max_ngram): a repetition loop's
    copies are never sent, only what find_loop keeps of it (the text before it and its first copy). Once a
    run qualifies as a loop (find_loop's rule), nothing more is sent: the page is degenerate.
    `decode(ids)` is the tokenizer's decoding of special-free token ids, by bytes (byte-level BPE).
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        sink: Callable[[str], None],
        max_ngram: int,
        min_repeats: int,
        min_tokens: int,
    ) -> None:
        self._decode = decode
        self._sink = sink
        self._max_ngram = max_ngram
        self._min_repeats = min_repeats
        self._min_tokens = min_tokens
        self._ids: list[int] = []
        self._runs = [0] * (max_ngram + 1)  # _runs[p]: the last tokens, each equal to the one p before it
        self._line_start = 0  # tokens before it decode to _lines (whole lines)
        self._lines = ""
        self.sent = ""
        self.looped = False

    def feed(self, ids: Iterable[int]) -> None:
        if self.looped:
            return
        runs = self._runs
        for token in ids:
            self._ids.append(token)
            n = len(self._ids) - 1
            for p in range(1, self._max_ngram + 1):
                if p <= n and self._ids[n - p] == token:
                    runs[p] += 1
                    covered = runs[p] + p
                    if covered >= self._min_tokens and covered // p >= self._min_repeats:
                        self.looped = True
                        return
                else:
                    runs[p] = 0
        n = len(self._ids)
        # Up to the first repeated token of any run still going on.
        settled = min((n - r for r in runs[1:] if r), default=n)
        if settled <= self._line_start:
            return
        tail = self._decode(self._ids[self._line_start : settled])
        if tail.endswith("\ufffd"):
            return  # a character not written whole yet
        text = self._lines + tail
        if tail.endswith("\n"):
            self._line_start, self._lines = settled, text
        live = text.strip()  # as the page's text is: trailing spaces wait for what follows them
        if len(live) > len(self.sent) and live.startswith(self.sent):
            piece, self.sent = live[len(self.sent) :], live
            self._sink(piece)
