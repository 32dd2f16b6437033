"""The rapidocr engine's words (ocr_app/engines/rapidocr/engine.py _words): RapidOCR's word_results taken only
where they are one-to-one with the lines and spell each line; boxes normalised and clipped to the page."""

from __future__ import annotations

from types import SimpleNamespace

from ocr_app.engines.rapidocr.engine import _spells, _words


def quad(x0: float, y0: float, x1: float, y1: float) -> list[list[float]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def out(txts, word_results):
    return SimpleNamespace(txts=txts, word_results=word_results)


def test_words_that_spell_their_line_are_kept_normalised_and_clipped():
    got = _words(out(("Fish & Chips",), ((("Fish", 0.9, quad(10, 5, 50, 25)), ("&", 1.5, quad(55, 5, 60, 25)),
                                           ("Chips", 0.8, quad(65, 5, 240, 25))),)), 200, 100)  # fmt: skip
    [line] = got
    assert line is not None
    assert [(w.text, w.bbox, w.confidence) for w in line] == [
        ("Fish", (0.05, 0.05, 0.25, 0.25), 0.9),
        ("&", (0.275, 0.05, 0.3, 0.25), 1.0),  # a score over 1 is 1
        ("Chips", (0.325, 0.05, 1.0, 0.25), 0.8),  # clipped at the page's right edge (200)
    ]


def test_words_that_do_not_spell_their_line_are_dropped():
    got = _words(out(("ab c", "de"), ((("ab", 0.9, quad(0, 0, 5, 5)), ("x", 0.9, quad(6, 0, 9, 5))),
                                      (("de", 0.9, quad(0, 10, 5, 15)),))), 10, 20)  # fmt: skip
    assert got[0] is None and got[1] is not None and [w.text for w in got[1]] == ["de"]


def test_word_results_not_one_to_one_with_the_lines_are_not_used():
    # RapidOCR leaves a line without located words out of word_results: which belongs to which is lost.
    got = _words(out(("ab", "cd"), ((("cd", 0.9, quad(0, 0, 5, 5)),),)), 10, 10)
    assert got == [None, None]
    assert _words(out(("ab",), ()), 10, 10) == [None]
    assert _words(out(("ab",), ((("ab", 0.9, "not a box"),),)), 10, 10) == [None]


def test_words_spell_their_line_only_with_its_spaces_between_them():
    assert _spells(["Fish", "&", "Chips"], "Fish  & Chips ")
    assert _spells(list("北京是首都"), "北京是首都")
    assert _spells(["价格", "3.50", "元"], "价格 3.50元")
    # A word over one of the text's spaces (RapidOCR read "gęślą jaźń" as one word): the PDF's layer would
    # lose the space.
    assert not _spells(["Zażółć", "gęśląjaźń"], "Zażółć gęślą jaźń")
    assert not _spells(["ab", "c"], "ab cd")
    assert not _spells(["ab", "cd", "e"], "ab cd")
    assert not _spells([], "ab")
