"""A rapidocr model revision: the files of a `model_path` directory (what the ocr_model role installs),
checked before they load, and written from the installed wheel (`ocr-app rapidocr-models DIR`).

A revision holds det.onnx, rec.onnx, rec_keys.txt (the recogniser's dictionary: one character per line)
and cls.onnx (needed with rapidocr_use_cls; rapidocr_orientation uses the wheel's where a revision has
none). The wheel's rec model carries its dictionary inside; a revision's rec.onnx must not (the copy drops
it), so that the dictionary loaded is always the revision's own rec_keys.txt.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

from ..base import EngineError

# A revision's files, by role; the wheel's own file of each (rapidocr's default models) is the source of
# `ocr-app rapidocr-models`.
REVISION_FILES = {"det": "det.onnx", "rec": "rec.onnx", "rec_keys": "rec_keys.txt", "cls": "cls.onnx"}
WHEEL_FILES = {
    "det": "PP-OCRv6_det_small.onnx",
    "rec": "PP-OCRv6_rec_small.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
}
DICT_KEY = "character"  # the metadata entry in which a rec model carries its dictionary


def check_revision(model_dir: Path, use_cls: bool) -> dict[str, Path]:
    """The revision's files by role, as far as they can be checked without loading them (EngineError)."""
    if not model_dir.is_dir():
        raise EngineError(f"model_path {model_dir} is not a directory")
    needed = ["det", "rec", "rec_keys"] + (["cls"] if use_cls else [])
    files = {k: model_dir / REVISION_FILES[k] for k in needed}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        with_cls = " (rapidocr_use_cls is on)" if "cls.onnx" in missing else ""
        raise EngineError(
            f"model_path {model_dir} lacks {', '.join(missing)}{with_cls}: a rapidocr model "
            "revision holds det.onnx, rec.onnx, rec_keys.txt and cls.onnx "
            "(`ocr-app rapidocr-models DIR` writes one)"
        )
    if (model_dir / REVISION_FILES["cls"]).is_file():
        files["cls"] = model_dir / REVISION_FILES["cls"]
    try:
        if DICT_KEY in onnx_metadata(files["rec"].read_bytes()):
            raise EngineError(
                f"{files['rec']} carries its own dictionary (ONNX metadata {DICT_KEY!r}), which rapidocr "
                f"would use instead of {files['rec_keys'].name}: write the revision with `ocr-app "
                "rapidocr-models`, which drops it"
            )
    except ValueError as err:
        raise EngineError(f"{files['rec']} is not an ONNX model: {err}") from None
    return files


# --- a model's ONNX metadata ----------------------------------------------------------------------------
# An ONNX model is a protobuf ModelProto; its metadata_props (field 14) are StringStringEntryProto
# {key: 1, value: 2}. Reading and dropping one entry needs only the wire format, not the onnx package.
_METADATA_FIELD = 14


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int, bytes | None]]:
    """(field number, start, end, payload) of each top-level field; payload only for length-delimited ones."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        payload = None
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            payload, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, start, pos, payload


def _entry(payload: bytes) -> tuple[str, str]:
    kv = {n: p.decode("utf-8") for n, _, _, p in _fields(payload) if p is not None}
    return kv.get(1, ""), kv.get(2, "")


def onnx_metadata(model: bytes) -> dict[str, str]:
    return dict(_entry(p) for n, _, _, p in _fields(model) if n == _METADATA_FIELD and p is not None)


def drop_onnx_metadata(model: bytes, key: str) -> bytes:
    out, last = [], 0
    for n, start, end, payload in _fields(model):
        if n == _METADATA_FIELD and payload is not None and _entry(payload)[0] == key:
            out.append(model[last:start])
            last = end
    out.append(model[last:])
    return b"".join(out)


def export_wheel_models(out: Path) -> list[Path]:
    """Write the rapidocr wheel's default models into `out` as a model revision; the files written."""
    import rapidocr

    src = Path(rapidocr.__file__).parent / "models"
    missing = [name for name in WHEEL_FILES.values() if not (src / name).is_file()]
    if missing:
        raise EngineError(f"rapidocr {version('rapidocr')} does not ship {', '.join(missing)} in {src}")
    out.mkdir(parents=True, exist_ok=True)
    rec = (src / WHEEL_FILES["rec"]).read_bytes()
    chars = onnx_metadata(rec).get(DICT_KEY, "").splitlines()
    if not chars:
        raise EngineError(f"{src / WHEEL_FILES['rec']} carries no dictionary (metadata {DICT_KEY!r})")
    keys = "\n".join(chars) + "\n"
    # rapidocr reads the file as bytes split at b"\n": the copy must give back exactly the model's own list.
    if [line.decode("utf-8") for line in keys.encode("utf-8").split(b"\n")[:-1]] != chars:
        raise EngineError(f"the dictionary of {src / WHEEL_FILES['rec']} does not survive one entry per line")
    written = []
    for role, data in (("rec", drop_onnx_metadata(rec, DICT_KEY)), ("rec_keys", keys.encode("utf-8"))):
        (out / REVISION_FILES[role]).write_bytes(data)
        written.append(out / REVISION_FILES[role])
    for role in ("det", "cls"):
        shutil.copyfile(src / WHEEL_FILES[role], out / REVISION_FILES[role])
        written.append(out / REVISION_FILES[role])
    return written
