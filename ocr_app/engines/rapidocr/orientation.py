"""Page orientation: a page turned sideways or upside down is read upright.

A page turned 90 or 270 degrees has its text lines standing: the detector still finds
them, as boxes much taller than wide (the long side at least SIDEWAYS_ELONGATION times the short one,
the ratio at which rapidocr itself stands a crop back up for recognition). When most of the page's
elongated boxes, weighted by their length, stand, the page is sideways. The text-line angle classifier
(the cls model: 0 or 180 per line) then tells the way up from a few of the longest lines: on an upright
or upside-down page, 180 for the page upside down; on a sideways page, from the crops rapidocr turned
90 degrees counterclockwise, 180 for a page turned counterclockwise (it needs 90 clockwise), 0 for one
turned clockwise (270). An upright page costs only the classifier on ORIENT_SAMPLE crops (the detector
ran anyway and its crops are recognised as they are); a turned page is rotated and run again. An upright
page the classifier would turn over is turned only if the recogniser reads the sampled lines more surely
turned over than as they are (page_rotation): on a real table page the classifier called tightly set lines
upside down.

Between detection and recognition, the upright page's line boxes are fitted to its gutters (gutters.py): a
box the detector ran across a narrow gutter between two columns is split there, so that the recogniser
reads each column's line and the layout can order the columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..gutters import fitted_quads, gutter_pieces
from ..layout import Box

ROTATIONS = (0, 90, 180, 270)
SIDEWAYS_ELONGATION = 1.5
ORIENT_SAMPLE = 6  # one classifier batch
# An upright page is turned over only when the lines sampled say 180 clearly: their scores for 180
# outweigh those for 0 by this share (the classifier misreads some short lines; a wrong flip ruins a page).
FLIP_SHARE = 0.7


def oriented(inst: Any, image: Any, turn: bool = True) -> tuple[Any, int]:
    """The RapidOCR output for the page turned upright (with `turn`; else read as sent), its line boxes
    fitted to the page's gutters before recognition (gutters.py), and the rotation applied (degrees
    clockwise)."""
    import cv2
    from rapidocr.ch_ppocr_cls import TextClsOutput
    from rapidocr.main import RapidOCRError
    from rapidocr.utils.output import RapidOCROutput

    ori = inst.load_img(image)
    img, op_record = inst.preprocess_img(ori)
    try:
        crops, det_res = inst.detect_and_crop(img, op_record)
    except RapidOCRError:  # nothing detected: a blank page
        return RapidOCROutput(), 0
    if turn:
        rotation = page_rotation(
            np.asarray(det_res.boxes, dtype=np.float64), crops, inst._load_cls_model(), inst.recognize_txt
        )
        if rotation:
            # cv2's codes turn clockwise (90), 180, counterclockwise (270 clockwise).
            code = {90: cv2.ROTATE_90_CLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_COUNTERCLOCKWISE}
            return oriented(inst, cv2.rotate(ori, code[rotation]), turn=False)[0], rotation
    # RapidOCR pads a strip of text (a line's image) above and below before detection; a page is not padded
    # (op_record says by how much), and only a page has gutters.
    if not op_record.get("padding_1", {}).get("top"):
        crops = fit_gutters(inst, img, det_res, crops)
    # Upright: the rest of RapidOCR.run_ocr_steps and its output, on the detection already made.
    cls_res, lines = TextClsOutput(), crops
    try:
        if inst.use_cls:
            lines, cls_res = inst.cls_and_rotate(list(crops))
        rec_res = inst.recognize_txt(lines)
    except RapidOCRError:
        return RapidOCROutput(), 0
    return inst.build_final_output(ori, det_res, cls_res, rec_res, crops, op_record), 0


def fit_gutters(inst: Any, img: np.ndarray, det_res: Any, crops: list[Any]) -> list[Any]:
    """The detection's boxes fitted to the page's gutters (gutters.py: split where a box runs across one,
    ends pulled back out of one), in place in det_res (each piece with its box's score), and the crops of
    the boxes as they are then."""
    quads = np.asarray(det_res.boxes, dtype=np.float64)
    fitted, source = fitted_quads(quads, gutter_pieces(quads, img))
    if len(fitted) == len(quads) and np.array_equal(fitted, quads):
        return crops
    det_res.boxes = fitted.astype(np.asarray(det_res.boxes).dtype)
    det_res.scores = [det_res.scores[k] for k in source]
    # A box only pulled back at its ends is read from its crop as detected (the recogniser reads a crop as
    # the detector padded it a little better: on the invoice of the development set, CER 0.166 against
    # 0.168 recropped); a split box's pieces from their own crops.
    pieces = np.bincount(source, minlength=len(quads))
    cut = inst.crop_text_regions(img, det_res.boxes[[k for k, i in enumerate(source) if pieces[i] > 1]])
    split = iter(cut)
    return [crops[i] if pieces[i] == 1 else next(split) for i in source]


def page_rotation(
    boxes: np.ndarray,
    crops: list[Any],
    classify: Callable[[list[Any]], Any],
    recognise: Callable[[list[Any]], Any] | None = None,
) -> int:
    """The clockwise rotation (0, 90, 180, 270) that turns the page upright, from its detected text boxes
    (n x 4 x 2 quadrilaterals, clockwise from the top left) and their crops as rapidocr cut them (standing
    ones turned 90 degrees counterclockwise), with `classify` the text-line angle classifier. With
    `recognise` (the recogniser: crops to an output with `scores`), an upright page the classifier would
    turn over is turned only if the recogniser reads the sampled lines turned over more surely than as they
    are: the classifier misreads tightly set lines (a headnote's crop takes in its neighbours), and
    upside-down text reads with a far lower score than upright text."""
    if not len(boxes):
        return 0
    widths = np.linalg.norm(boxes[:, 1] - boxes[:, 0], axis=1)
    heights = np.linalg.norm(boxes[:, 3] - boxes[:, 0], axis=1)
    standing = heights >= SIDEWAYS_ELONGATION * widths
    lying = widths >= SIDEWAYS_ELONGATION * heights
    sideways = heights[standing].sum() > widths[lying].sum()
    pool = np.flatnonzero(standing if sideways else lying)
    if not len(pool):
        return 0
    sample = pool[np.argsort(-np.maximum(widths, heights)[pool], kind="stable")[:ORIENT_SAMPLE]]
    votes = classify([crops[i] for i in sample]).cls_res
    flipped = sum(score for label, score in votes if "180" in label)
    upright = sum(score for label, score in votes if "180" not in label)
    if sideways:
        return 90 if flipped > upright else 270
    if not flipped > FLIP_SHARE * (flipped + upright):
        return 0
    if recognise is None:
        return 180
    lines = [crops[i] for i in sample]
    as_is = _mean_score(recognise, lines)
    turned = _mean_score(recognise, [np.rot90(c, 2) for c in lines])
    return 180 if turned > as_is else 0


def _mean_score(recognise: Callable[[list[Any]], Any], crops: list[Any]) -> float:
    try:
        scores = [float(s) for s in recognise(crops).scores]
    except Exception:  # rapidocr raises when it reads nothing at all: no evidence either way
        return 0.0
    return sum(scores) / len(scores) if scores else 0.0


def unrotate(bbox: Box | None, rotation: int) -> Box | None:
    """A normalised box on the page turned `rotation` degrees clockwise, back on the page as sent."""
    if bbox is None:
        return None
    u0, v0, u1, v1 = bbox
    if rotation == 90:  # turning clockwise took (x, y) to (1 - y, x)
        box = (v0, 1 - u1, v1, 1 - u0)
    elif rotation == 180:
        box = (1 - u1, 1 - v1, 1 - u0, 1 - v0)
    else:  # 270: (x, y) went to (y, 1 - x)
        box = (1 - v1, u0, 1 - v0, u1)
    x0, y0, x1, y1 = (round(min(1.0, max(0.0, v)), 5) for v in box)
    return (x0, y0, x1, y1)
