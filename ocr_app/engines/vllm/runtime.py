"""vLLM itself: its few names imported once, its engine built in a daemon thread, the checkpoint's weight
files read before it loads, and its own metrics exported beside ours."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..base import EngineError

T = TypeVar("T")


class Vllm:
    """The few vLLM names the engine uses, imported once (import vllm takes seconds)."""

    def __init__(self) -> None:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.platforms import current_platform
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.utils.import_utils import import_pynvml
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        self.AsyncEngineArgs = AsyncEngineArgs
        self.SamplingParams = SamplingParams
        self.RequestOutputKind = RequestOutputKind
        self.AsyncLLM = AsyncLLM
        self.EngineDeadError = EngineDeadError
        self.current_platform = current_platform
        self.parse_model_prompt = parse_model_prompt
        self.import_pynvml = import_pynvml


def import_vllm() -> Vllm:
    try:
        return Vllm()
    except ImportError as err:
        raise EngineError(f"vLLM cannot be imported: {err}") from err


async def in_daemon_thread(build: Callable[..., T], *args: Any) -> T:
    """build(*args) in a daemon thread: a stop during the load (minutes on a GPU host) does not wait
    for it, as it would for asyncio.to_thread's pool. An engine built after nobody waits is shut down."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if done.cancelled():
            if ok:
                value.shutdown()
        elif ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            value: Any = build(*args)
            ok = True
        except BaseException as err:
            value, ok = err, False
        try:
            loop.call_soon_threadsafe(deliver, ok, value)
        except RuntimeError:  # the loop is closed: the app has stopped
            if ok:
                value.shutdown()

    threading.Thread(target=run, name="vllm-load", daemon=True).start()
    return await done


def weight_files(model: Path) -> list[Path]:
    """The checkpoint's safetensors files, each header read (a truncated or foreign file fails here)."""
    index = model / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            files = [model / n for n in names]
        else:
            files = sorted(model.glob("*.safetensors"))
        if not files:
            raise EngineError(f"model {model} has no *.safetensors weights")
        for f in files:
            with f.open("rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 0 < size <= f.stat().st_size - 8:
                    raise EngineError(f"{f}: not a safetensors file (header size {size})")
                json.loads(fh.read(size))
    except (OSError, ValueError, KeyError) as err:
        raise EngineError(f"model {model}: weights unreadable: {err}") from err
    return files


class VllmMetrics:
    """vLLM's own metrics (`vllm:*`, in prometheus_client's global registry) for our /metrics, and
    the requests vLLM holds for us (queued or running; aborted ones leave at once)."""

    def __init__(self, unfinished: Callable[[], int], aborted: Callable[[], int]):
        self.unfinished = unfinished
        self.aborted = aborted

    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily(
            "ocr_vllm_unfinished_requests",
            "Page generations vLLM holds, queued or running",
            value=self.unfinished(),
        )
        yield CounterMetricFamily(
            "ocr_vllm_aborted_requests",
            "Page generations aborted inside vLLM: their request was cancelled (deadline, client gone)",
            value=self.aborted(),
        )
        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family
