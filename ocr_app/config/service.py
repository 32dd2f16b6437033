"""The service's settings: where it listens, who may call, the limits on each request, and how it runs in a
fleet (the canary's replays, draining, logs, health)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .base import MiB, default_doc


class NetworkSettings(BaseModel):
    """Where the instance listens."""

    host: str = Field("127.0.0.1", description="Address to listen on (put nginx in front; keep loopback).")
    port: int = Field(8000, ge=1, le=65535, description="Port to listen on.")


class RequestSettings(BaseModel):
    """Who may call, and the limits and deadlines that protect the host from each request."""

    # Auth
    api_keys_file: Path | None = Field(
        None,
        description="API keys, `name:sha256hex` lines, re-read when the file changes and on SIGHUP; "
        "required unless auth_disabled.",
    )
    auth_disabled: bool = Field(
        False, description="Run without API keys (logged as a warning); must be explicit."
    )

    # Limits that protect the host
    max_upload_bytes: int = Field(20 * MiB, ge=1024, description="Largest request body in bytes.")
    max_pixels: int = Field(50_000_000, ge=10_000, description="Largest page: width x height as sent.")
    max_image_side: int = Field(
        1540,
        ge=64,
        le=10_000,
        description="Longest side in pixels of the page the engine sees (what LightOnOCR expects).",
    )
    max_pages: int = Field(50, ge=1, le=10_000, description="Pages per request.")
    # POST /v1/chat/completions and GET /v1/models: OpenAI's API, as LightOnOCR's instructions serve it.
    openai_model_name: str = Field(
        "lightonai/LightOnOCR-2-1B",
        min_length=1,
        description="The model name /v1/models lists and chat completions answer with (any name is taken "
        "in requests).",
    )
    pdf_dpi: int = Field(200, ge=36, le=600, description="PDF render resolution in dots per inch.")
    request_timeout_s: float = Field(
        30.0, gt=0, description="Deadline per request in seconds, queue included."
    )
    # Requests in flight per instance; None: the engine's own (Settings.for_engine): vllm's batch
    # (vllm_max_num_seqs), so a GPU host deployed with the defaults runs full batches; the CPU engine's
    # workers, at least 2 (one request decodes while another is recognised).
    max_concurrency: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Requests in flight per instance.",
        json_schema_extra=default_doc(
            "the engine's: vllm_max_num_seqs on vllm (a full batch), "
            "rapidocr_workers (at least 2) on rapidocr"
        ),
    )
    max_queue: int = Field(
        8,
        ge=0,
        le=100_000,
        description="Requests waiting for a slot per instance; beyond it 503 overloaded (size it so that a "
        "full queue drains within request_timeout_s).",
    )
    # Decode worker processes (ocr_app/documents/decode.py) and the bounds on each document's decode.
    preprocess_workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=64,
        description="Decode worker processes: multipart parsing, PDF render, TIFF frames, image decode and "
        "resize.",
        json_schema_extra=default_doc("CPUs"),
    )
    render_workers: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=256,
        description="Results rendered at once in another format than JSON (pdf, hocr, alto, text, markdown; "
        "a job's pdf); more wait for a slot within their request's deadline.",
        json_schema_extra=default_doc("CPUs"),
    )
    decode_cpu_s: int = Field(
        20,
        ge=1,
        le=3600,
        description="CPU seconds one document may take in its decode worker (RLIMIT_CPU); beyond it 413 "
        "decode_cpu_limit.",
    )
    # Address space per worker above its libraries: a 50 MP page's RGBA and RGB copies, 50 pages at 1540 px.
    decode_memory_mb: int = Field(
        2048,
        ge=256,
        le=1_048_576,
        description="Address space in MB a decode worker may take above the libraries it starts with "
        "(RLIMIT_AS); beyond it 413 decode_memory_limit.",
    )


class OperationSettings(BaseModel):
    """Running in a fleet: the canary's shadow replays, draining and stopping, logs, and when /healthz takes
    the instance out."""

    # Shadow comparison during a canary upgrade (ocr_app/fleet/shadow.py): while shadow_file exists (JSON
    # {"url", "share"}, written by the ocr_app role's `shadow`), a share of this instance's 200 answers is
    # replayed to the canary at url and the texts compared; None: never. shadow_ca_file verifies the canary's
    # HTTPS (None: the system's CAs). At most shadow_max_inflight replays at once: a sampled request finding
    # them all busy is skipped, never queued.
    shadow_file: Path | None = Field(
        Path("/run/ocr-app/shadow.json"),
        description="While this control file exists (JSON {url, share}), that share of the 200 answers is "
        "replayed to the canary at url and the texts compared; none: never.",
    )
    shadow_ca_file: Path | None = Field(
        None,
        description="CA bundle that verifies the canary's HTTPS (none: the system's CAs); one the app "
        "cannot load turns the replays off, never the service.",
    )
    shadow_max_inflight: int = Field(
        1,
        ge=1,
        le=64,
        description="Replays in flight at once; a sampled request finding them all busy is skipped, never "
        "queued.",
    )
    shadow_route: Literal["ocr", "chat"] = Field(
        "ocr",
        description="How a replay reaches the canary: ocr sends the request again to url (/v1/ocr) and "
        "compares each page's text; chat sends its document as an image to the canary's "
        "/v1/chat/completions (url's path replaced) and compares the Markdown answers (a multipart or a "
        "pages= request is replayed as with ocr).",
        json_schema_extra={"default_doc": "ocr"},
    )

    # Lifecycle
    drain_file: Path | None = Field(
        Path("/run/ocr-app/drain"),
        description="While this file exists /healthz says draining (the load balancers take the instance "
        "out); requests are still served.",
    )
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="Seconds in-flight requests may finish after SIGTERM."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="The log level.")
    # A request slower than this is logged at warning priority (`journalctl -p warning` finds it).
    slow_request_s: float = Field(
        10.0, gt=0, description="A request slower than this (seconds) is logged at warning priority."
    )

    # /healthz turns 503 `degraded` (the load balancer takes the instance out) while it cannot take new
    # work in reasonable time; each condition clears by itself (ocr_app/ocr/health.py).
    # The event loop woke this much late (every request waited as long): out for the window after it.
    health_loop_lag_s: float = Field(
        1.0, gt=0, description="/healthz is 503 degraded once the event loop woke this many seconds late..."
    )
    health_loop_lag_window_s: float = Field(
        30.0, gt=0, description="...and for this many seconds after it (then 200 again by itself)."
    )
    # A no-op task waited this long for a decode worker. A worker is freed at its request's deadline
    # (request_timeout_s) at the latest, so twice the default deadline means workers are not freed.
    health_decode_stall_s: float = Field(
        60.0,
        gt=0,
        description="/healthz is 503 degraded while a probe has waited this many seconds for a decode "
        "worker (keep it above request_timeout_s, the latest a worker is freed).",
    )
    # Requests in the engine and no page finished for this long: wedged. A vllm page that writes
    # vllm_max_tokens and is retried takes tens of seconds; a rapidocr page, seconds.
    health_engine_stall_s: float = Field(
        120.0,
        gt=0,
        description="/healthz is 503 degraded while requests are in the engine and no page finished for "
        "this many seconds (a vllm page that reaches vllm_max_tokens and is retried takes tens of "
        "seconds).",
    )
    # Disk: a request that cannot be written where the host buffers it fails (nginx's body buffers: a 500),
    # so the instance leaves the pool before that. The app's own temp directory is always watched.
    health_disk_paths: list[Path] = Field(
        [],
        description="/healthz is 503 degraded while the filesystem of one of these paths (or of the app's "
        "temp directory, always watched) has less than health_disk_min_free_mb free: e.g. nginx's body "
        "buffers (/var/lib/nginx) and the journal (/var/log/journal). A path not made yet is measured on "
        "the filesystem it would be made on.",
    )
    health_disk_min_free_mb: int = Field(
        256,
        ge=1,
        description="Free space (MiB, as an unprivileged user sees it) below which a watched filesystem "
        "takes the instance out (health_disk_paths).",
    )
