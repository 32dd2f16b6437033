from __future__ import annotations

import asyncio

import pytest

from .docs import CJK_FONT, LATIN_FONT
from .server import Server


def pytest_sessionstart(session):
    missing = [str(f) for f in (LATIN_FONT, CJK_FONT) if not f.exists()]
    if missing:
        raise pytest.UsageError(f"test fonts missing: {missing}; run `make test` (it installs them)")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The app as operators run it, with the real rapidocr engine; shared by the contract tests."""
    srv = Server(tmp_path_factory.mktemp("server"), rapidocr_workers=2, max_concurrency=2).start()
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


@pytest.fixture(scope="module")
def engine():
    """The rapidocr engine loaded in-process (one worker of two threads), one per test module that asks for
    it; a module that needs other settings defines its own `engine`."""
    from ocr_app.engines.rapidocr.engine import RapidOcrEngine

    eng = RapidOcrEngine(workers=1, threads=2)
    asyncio.run(eng.load())
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="session")
def postgres():
    """One throw-away PostgreSQL cluster for the session; each user creates its own database in it."""
    from .postgres import Cluster

    cluster = Cluster().start()
    yield cluster
    cluster.stop()
