"""The probes: /healthz (what the load balancers route by: ready, or why not), /livez, /metrics."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...config import MiB
from ...engines.base import Engine
from ...schemas import Health
from ..deps import State
from ..state import VERSION

router = APIRouter()


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(state: State) -> JSONResponse:
    status, problems = state.health_status()
    body = Health(
        status=status,  # type: ignore[arg-type]
        reason="; ".join(p.message for p in problems) or None,
        problems=problems,
        model_loaded=state.status == "ready",
        engine=state.engine.name,
        model=state.engine.model,
        device=state.engine.device,
        available_memory_mb=_free_memory_mb(state.engine),
        version=VERSION,
        inflight=state.admission.inflight,
        queued=state.admission.queued,
        job_store=state.jobs.store.state() if state.jobs is not None else "off",
    )
    return JSONResponse(body.model_dump(), status_code=200 if status == "ready" else 503)


@router.get("/livez")
async def livez() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/metrics", include_in_schema=False)
async def metrics(state: State) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _free_memory_mb(engine: Engine) -> int:
    """The engine's device (a GPU's free memory), else the host's available memory."""
    device = engine.available_memory_mb()
    return device if device is not None else _available_memory_mb()


def _available_memory_mb() -> int:
    avail = None
    with suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    # Inside a systemd unit with MemoryMax=, the cgroup's headroom is what matters.
    with suppress(OSError, ValueError):
        cg = Path("/sys/fs/cgroup")
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int((cg / "memory.current").read_text())
            avail = room if avail is None else min(avail, room)
    return max(0, (avail or 0) // MiB)
