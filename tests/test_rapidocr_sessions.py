"""ONNX Runtime's threads do not spin in the service's rapidocr sessions (engine.py, ORT_SESSION_CONFIG): the
options are read back from every session a loaded instance holds (det, cls, rec), through ONNX Runtime's own
API, and the pages still read right. The CPU it saves is measured in `make bench` (measurement 7)."""

from __future__ import annotations

import asyncio

import jiwer
import pytest

from ocr_app.engines.rapidocr.engine import RapidOcrEngine

from .docs import TEXTS, render

KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


@pytest.fixture
def engine():
    eng = RapidOcrEngine(workers=1, threads=2, job_workers=1, orientation=True)
    asyncio.run(eng.load())
    yield eng
    asyncio.run(eng.close())


def _instances(eng: RapidOcrEngine) -> list:
    out = []
    for idle in (eng._idle, eng._job_idle):
        assert idle is not None
        inst = idle.get()
        out.append(inst)
        idle.put(inst)
    return out


def test_every_session_of_every_instance_is_built_without_spinning(engine):
    doc = render(TEXTS["en"])
    page = engine._run(doc.image)
    assert jiwer.cer("".join(doc.text.split()), "".join(page.joined_text().split())) < 0.02
    for inst in _instances(engine):  # the interactive instance and the job instance
        sessions = {name: getattr(inst, name) for name in ("text_det", "text_cls", "text_rec")}
        assert all(s is not None for s in sessions.values()), sessions  # loaded at load(), not lazily later
        for name, stage in sessions.items():
            options = stage.session.session.get_session_options()
            assert {k: options.get_session_config_entry(k) for k in KEYS} == dict.fromkeys(KEYS, "0"), name
            assert options.intra_op_num_threads == 2, name
