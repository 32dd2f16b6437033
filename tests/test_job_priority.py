"""Bulk-job pages run behind interactive work: on the rapidocr engine on instances and threads of their own,
at nice 19, so that an interactive page neither waits for a job page nor shares the CPU with it on equal
terms; on every engine their decode in worker processes of their own, at nice 19 too."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest

from ocr_app.config import Settings
from ocr_app.engines import create_engine
from ocr_app.engines.base import SELF_TEST_TEXT, sample_page
from ocr_app.engines.rapidocr.engine import JOB_THREAD_NAME, RapidOcrEngine
from ocr_app.metrics import Metrics
from ocr_app.ocr.pipeline import Pipeline


def threads() -> list[tuple[str, int, int]]:
    """(name, scheduling policy, nice) of each of this process's threads (/proc: stat's fields 41, 19)."""
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()  # fields from the 3rd on
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        out.append((name, int(fields[41 - 3]), int(fields[19 - 3])))
    return out


def text(page) -> str:
    return " ".join(line.text for line in page.lines)


@pytest.fixture(scope="module")
def engine():
    eng = RapidOcrEngine(workers=1, threads=2, job_workers=1, orientation=False)
    asyncio.run(eng.load())
    yield eng
    asyncio.run(eng.close())


def test_job_threads_run_at_nice_19_and_interactive_ones_do_not(engine):
    assert engine.job_priority == "nice 19"
    names = threads()
    job = [(policy, nice) for name, policy, nice in names if name == JOB_THREAD_NAME]
    # The pool's thread and those ONNX Runtime started for the job instance's sessions, which inherit it.
    assert len(job) >= 2, names
    assert set(job) == {(os.SCHED_OTHER, 19)}, names
    assert {(policy, nice) for name, policy, nice in names if name != JOB_THREAD_NAME} == {
        (os.SCHED_OTHER, os.nice(0))  # the test's own (0, or what `nice` gave it)
    }, names


def test_an_interactive_page_does_not_wait_for_a_running_job_page(engine):
    """workers=1: with shared instances the interactive page would wait for the job page to end."""
    started, release = threading.Event(), threading.Event()
    real = engine._job_idle.get()

    class Held:  # the job instance, kept busy from its page's detection until the interactive page is back
        def __getattr__(self, name):
            return getattr(real, name)

        def detect_and_crop(self, *args, **kwargs):
            started.set()
            release.wait(30)
            return real.detect_and_crop(*args, **kwargs)

    engine._job_idle.put(Held())

    async def run():
        job = asyncio.create_task(engine.recognize([sample_page()], background=True))
        assert await asyncio.to_thread(started.wait, 20)  # the job page holds the job instance
        try:
            [page] = await asyncio.wait_for(engine.recognize([sample_page()]), 20)
            assert not job.done()
        finally:
            release.set()
        return page, (await job)[0]

    try:
        interactive, background = asyncio.run(run())
    finally:
        engine._job_idle.get()
        engine._job_idle.put(real)
    assert "2048" in text(interactive) and "2048" in text(background), SELF_TEST_TEXT


def test_a_refused_priority_change_is_said_and_job_pages_still_run(monkeypatch, caplog):
    """An older unit's seccomp filter refuses setpriority (EPERM): job pages run at normal priority."""

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    eng = RapidOcrEngine(workers=1, threads=1, job_workers=1, orientation=False)
    with caplog.at_level(logging.WARNING, logger="ocr_app.engines.rapidocr"):
        asyncio.run(eng.load())
    try:
        assert eng.job_priority.startswith("normal (PermissionError"), eng.job_priority
        assert any("job pages run at normal CPU priority" in r.getMessage() for r in caplog.records)
        [page] = asyncio.run(eng.recognize([sample_page()], background=True))
        assert "2048" in text(page)
    finally:
        asyncio.run(eng.close())


def test_job_pages_decode_in_workers_of_their_own_at_nice_19():
    """The pipeline of an instance with a job database: a decode pool for job pages, each of its workers'
    threads at nice 19 (asked in the worker before OpenCV starts its resize thread, which inherits it),
    beside the interactive pool's at 0."""
    settings = Settings(
        engine="rapidocr", auth_disabled=True, database_url="postgresql://ocr@db/ocr", preprocess_workers=4
    )
    pipeline = Pipeline(settings, RapidOcrEngine(), Metrics())
    pools = {"interactive": pipeline.decode_pool, "jobs": pipeline.job_decode_pool}
    try:
        policies = {}
        for name, pool in pools.items():
            pool.start()
            policies[name] = pool._running_pool().schedule(threads).result(60)
        assert all(len(names) >= 2 for names in policies.values()), policies  # Python's and OpenCV's
        assert {name: {(policy, nice) for _, policy, nice in names} for name, names in policies.items()} == {
            "interactive": {(os.SCHED_OTHER, os.nice(0))},  # the test's own
            "jobs": {(os.SCHED_OTHER, 19)},
        }, policies
        assert (pipeline.decode_pool.workers, pipeline.job_decode_pool.workers) == (4, 2)
    finally:
        for pool in pools.values():
            pool.close()


@pytest.mark.parametrize(
    "config", [{}, {"database_url": "postgresql://ocr@db/ocr", "job_idle_priority": False}]
)
def test_without_a_job_database_or_idle_priority_job_pages_decode_in_the_shared_pool(config):
    settings = Settings(engine="rapidocr", auth_disabled=True, **config)
    pipeline = Pipeline(settings, RapidOcrEngine(), Metrics())
    try:
        assert pipeline.job_decode_pool is None
    finally:
        pipeline.decode_pool.close()


@pytest.mark.parametrize(
    ("config", "job_workers"),
    [
        ({}, 0),  # no job database: no job pages, no instances for them
        ({"database_url": "postgresql://ocr@db/ocr"}, 3),  # as many as the interactive ones
        ({"database_url": "postgresql://ocr@db/ocr", "rapidocr_job_workers": 1}, 1),
        ({"database_url": "postgresql://ocr@db/ocr", "rapidocr_job_workers": 0}, 0),  # shared, gate's order
        ({"database_url": "postgresql://ocr@db/ocr", "job_idle_priority": False}, 0),
    ],
)
def test_job_workers_follow_the_job_database(config, job_workers):
    settings = Settings(engine="rapidocr", auth_disabled=True, rapidocr_workers=3, **config)
    assert create_engine(settings).job_workers == job_workers
