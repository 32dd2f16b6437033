"""Settings: a YAML file overridden by OCR_APP_* environment variables, validated once at start."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.config import JsonDict
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

MiB = 1024 * 1024
# The prompt of a 1540x1540 page for LightOnOCR: 55 x 55 image tokens after the 2x2 merge, and the template.
VLLM_PAGE_TOKENS = 3100

# The YAML file to read for the next Settings() call; set by load_settings().
_config_file: ContextVar[Path | None] = ContextVar("ocr_app_config_file", default=None)


class ConfigError(Exception):
    """Configuration that cannot run; the message names each offending key."""


def _default_doc(doc: str) -> JsonDict:
    """A default chosen at start (from the host or the engine), as the configuration reference gives it."""
    return {"default_doc": doc}


class Settings(BaseSettings):
    """Every app setting: name, type, default, range and a one-line description. The kit's copies (the ocr_app
    role's defaults, argument specs and config.yml.j2; docs/configuration.md) are generated from it by
    scripts/gen_settings.py, and tests/test_settings_kit.py holds them equal."""

    model_config = SettingsConfigDict(env_prefix="OCR_APP_", extra="forbid", validate_default=True)

    # Network
    host: str = Field("127.0.0.1", description="Address to listen on (put nginx in front; keep loopback).")
    port: int = Field(8000, ge=1, le=65535, description="Port to listen on.")

    # Engine
    engine: Literal["auto", "rapidocr", "vllm"] = Field(
        "auto",
        description="The OCR engine: auto (vllm where a CUDA GPU, vLLM and model_path exist, else "
        "rapidocr), rapidocr or vllm.",
    )
    # The engine's model directory: the VLM for vllm; for rapidocr a revision of det.onnx, rec.onnx,
    # rec_keys.txt, cls.onnx (none: the rapidocr wheel's own models).
    model_path: Path | None = Field(
        None,
        description="The engine's model directory: the VLM's for vllm; for rapidocr a revision holding "
        "det.onnx, rec.onnx, rec_keys.txt and cls.onnx, as `ocr-app rapidocr-models DIR` writes it (none: "
        "the wheel's own models). Behind a `current` symlink the answers' and /healthz's model is "
        "<name>@<revision>.",
    )
    rapidocr_use_cls: bool = Field(
        False,
        description="RapidOCR's text-angle classifier on every line (upside-down lines; about 2x slower).",
    )
    # Turn a page fed sideways or upside down upright before recognition (its text boxes' shape, then the
    # cls model's vote on a few lines); bbox stays on the page as sent.
    rapidocr_orientation: bool = Field(
        True,
        description="Turn a page sent sideways or upside down upright before recognition (the page's "
        "rotation; an upright page costs the angle classifier on its 6 longest lines, a turned one a "
        "second detection).",
    )
    # workers x threads = cores: two threads per instance halve a lone request's latency, and
    # more instances than that only make their threads fight over the cores.
    rapidocr_threads: int = Field(
        default_factory=lambda: min(2, os.cpu_count() or 1),
        ge=1,
        le=64,
        description="ONNX Runtime threads per RapidOCR instance (workers x threads = cores).",
        json_schema_extra=_default_doc("2, or 1 on a 1-CPU host"),
    )
    rapidocr_workers: int = Field(
        default_factory=lambda: max(1, (os.cpu_count() or 1) // 2),
        ge=1,
        le=64,
        description="RapidOCR engine instances, each reading one page at a time.",
        json_schema_extra=_default_doc("CPUs / 2, at least 1"),
    )
    # Engine instances of their own for bulk-job pages, whose threads run at nice 19: the kernel gives them
    # next to no CPU time an interactive page wants, so a request that arrives while a job page runs is not
    # slowed by it (a CPU page cannot be stopped, only out-prioritised). Each costs an instance's memory
    # (~250 MB). 0: job pages take turns on the interactive workers (an interactive page then waits for the
    # job page running). None: rapidocr_workers where a job database is configured and job_idle_priority is
    # on (job pages alone fill the CPU), else 0.
    rapidocr_job_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="RapidOCR instances for bulk-job pages, their threads at nice 19 (~250 MB each); 0: job "
        "pages take turns on the workers, an interactive page then waits for the job page running.",
        json_schema_extra=_default_doc("rapidocr_workers with a job database and job_idle_priority, else 0"),
    )
    # RapidOCR's default ("min", 736) upscales a 1400x200 strip to 5000x736 before detection:
    # 25x slower at equal accuracy on our documents. "max" detects pages at their own size.
    rapidocr_det_limit_type: Literal["max", "min"] = Field(
        "max",
        description="The text detector's size limit applies to the page's longer side (max: pages at their "
        "own size) or its shorter one (min, RapidOCR's own default, upscales strips many times over).",
    )
    rapidocr_det_limit_side: int = Field(
        1536,
        ge=32,
        le=4096,
        description="The text detector's size limit in pixels (rapidocr_det_limit_type).",
    )

    # The vllm engine: LightOnOCR-2-1B in-process (vLLM AsyncLLM). Defaults are the model card's.
    vllm_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The dtype vLLM runs the model in."
    )
    # Context: a 1540x1540 page is ~3k image tokens, plus the answer (vllm_max_tokens_cap).
    vllm_max_model_len: int = Field(
        8192,
        ge=1024,
        le=65536,
        description="Context per page in tokens: it must hold a 1540x1540 page (3100 tokens) plus "
        "vllm_max_tokens_cap.",
    )
    vllm_max_num_seqs: int = Field(
        64,
        ge=1,
        le=4096,
        description="Pages decoded together (the batch); also max_concurrency's default on vllm.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="Share of the GPU's memory vLLM takes (weights and KV cache)."
    )
    vllm_enforce_eager: bool = Field(
        False, description="No CUDA graphs or torch.compile: starts faster, runs slower."
    )
    vllm_max_tokens: int = Field(
        4096, ge=1, description="Tokens per page unless a request asks for fewer or more."
    )
    vllm_max_tokens_cap: int = Field(
        4096, ge=1, description="The most tokens a request's max_tokens may ask for."
    )
    vllm_temperature: float = Field(
        0.2, ge=0.0, le=2.0, description="Sampling temperature (the model card's)."
    )
    vllm_top_p: float = Field(0.9, gt=0.0, le=1.0, description="Sampling's top_p (the model card's).")
    # A degenerate page (max_tokens reached, or a repetition loop) is retried once per entry.
    vllm_retry_temperatures: list[float] = Field(
        default_factory=lambda: [0.5, 0.8],
        max_length=8,
        description="A degenerate page (max_tokens reached, or a repetition loop) is retried once per "
        "entry, at that temperature (0 to 2); empty: no retry.",
    )
    # A repetition loop: an n-gram of at most loop_max_ngram tokens repeated at least loop_min_repeats
    # times in a row, covering at least loop_min_tokens tokens.
    vllm_loop_max_ngram: int = Field(
        64, ge=1, le=1024, description="A repetition loop is an n-gram of at most this many tokens..."
    )
    vllm_loop_min_repeats: int = Field(
        8, ge=2, description="...repeated at least this many times in a row..."
    )
    vllm_loop_min_tokens: int = Field(256, ge=2, description="...over at least this many tokens.")
    # Line boxes from the cpu extra's detector (rapidocr_* settings) aligned to the model's lines.
    vllm_grounding: bool = Field(
        True,
        description="Boxes for the model's lines from the CPU engine's detector (the rapidocr_* settings "
        "size its pool); off where ocr-app[cpu] is not installed.",
    )
    # The warm-up must read the built-in sample back (false for models that cannot, e.g. test ones).
    vllm_warmup_check_text: bool = Field(
        True,
        description="The warm-up generation must read the built-in sample's text back (false for models "
        "that cannot, e.g. test ones).",
    )

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
        json_schema_extra=_default_doc(
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
        json_schema_extra=_default_doc("CPUs"),
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

    # Bulk jobs (ocr_app/jobs/): PostgreSQL holds their state, every instance works them. Without
    # database_url the /v1/jobs routes answer 503. A libpq URL, e.g. postgresql://ocr@db/ocr?sslmode=verify-full
    # (a secret when it holds a password: never logged).
    database_url: str | None = Field(
        None,
        description="The bulk-job database (PostgreSQL), a libpq URL, e.g. "
        "postgresql://ocr@db/ocr?sslmode=verify-full (a secret when it holds a password: never logged); "
        "none: the /v1/jobs routes answer 503.",
    )
    job_range_pages: int = Field(8, ge=1, le=1000, description="Pages per claim (a lease covers one range).")
    job_lease_s: float = Field(
        60.0,
        ge=1.0,
        description="Seconds a range's lease may go unrenewed before another instance claims the range.",
    )
    job_poll_s: float = Field(
        1.0,
        gt=0,
        description="Seconds between an idle worker's looks for ranges, and an event stream's for pages.",
    )
    # Result-expiry timer, fleet-wide metrics and the schema check run this often.
    job_sweep_s: float = Field(
        30.0,
        gt=0,
        description="Seconds between runs of the result-expiry timer, the fleet-wide job metrics and the "
        "schema check.",
    )
    job_result_ttl_s: float = Field(
        24 * 3600.0,
        gt=0,
        description="Seconds a finished job (status, pages) is kept after it finished.",
    )
    max_job_bytes: int = Field(200 * MiB, ge=1024, description="Largest job document in bytes.")
    max_job_pages: int = Field(2000, ge=1, le=100_000, description="Pages per job document.")
    max_jobs_in_flight: int = Field(8, ge=1, le=10_000, description="Jobs queued or running per API key.")
    # Job pages share the engine with interactive requests, which come first (Admission.background_may_start
    # is the rule): a job page starts only while at most job_max_interactive interactive requests are in
    # flight or waiting, an interactive request counting for job_yield_s after it ends (a client's next
    # request usually follows at once). None: the engine's (Settings.for_engine): on rapidocr 0, as a job page
    # (nice 19) started beside busy interactive ones would crawl, its range held; on vllm half the batch,
    # which has room beside them.
    job_max_interactive: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="A job page starts only while at most this many interactive requests are in flight or "
        "waiting.",
        json_schema_extra=_default_doc("the engine's: 0 on rapidocr, vllm_max_num_seqs / 2 on vllm"),
    )
    job_yield_s: float = Field(
        0.25,
        ge=0,
        le=60,
        description="Seconds an interactive request still counts after it ended (its client's next one "
        "usually follows).",
    )
    # Job pages in flight per instance (their own count: they never take an interactive slot); None: the
    # engine's, as max_concurrency's, so that job pages alone fill the batch (the CPU engine's pipeline).
    job_max_inflight: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Job pages in flight per instance (a count of their own, not /v1/ocr slots).",
        json_schema_extra=_default_doc("max_concurrency's"),
    )
    # The longest a job page may take, decode and engine: both run behind interactive work (decode workers
    # of their own and, on rapidocr, engine threads at nice 19; vLLM's queue), so on a busy instance a
    # job page may take longer than a request's deadline and still be read. Past it: a page error `timeout`.
    job_page_timeout_s: float = Field(
        120.0,
        gt=0,
        description="The longest a job page may take in seconds, decode and engine (both behind interactive "
        "work, so longer than request_timeout_s); past it the page's error is timeout.",
    )
    # Job pages at nice 19 (ocr_app/sched.py): decoded in workers of their own (preprocess_workers / 2) and,
    # on rapidocr, read on rapidocr_job_workers instances. False: they decode in the shared pool and take
    # turns on the workers at normal priority (for hosts that share one kernel's CPUs, where the lowest
    # priority is the lowest across all of them).
    job_idle_priority: bool = Field(
        True,
        description="Job pages at nice 19: decoded in workers of their own (preprocess_workers / 2) and, on "
        "rapidocr, read on rapidocr_job_workers instances; false: the shared decode pool and turns on the "
        "workers at normal priority (hosts that share one kernel's CPUs).",
    )
    # Webhooks (ocr_app/jobs/webhooks.py): a job's webhook_url must lie under one of these URL prefixes
    # (same scheme, host and port; the path at or below the prefix's). Empty: webhooks refused. An
    # allow-list, as the app POSTs from inside the fleet's network: a client must not make it call arbitrary
    # internal addresses.
    job_webhook_allowed_urls: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="URL prefixes a job's webhook_url must lie under (same scheme, host and port; the path "
        "at or below the prefix's); empty: webhooks refused.",
    )
    # Signs the deliveries of jobs submitted without authentication (auth_disabled); None: sent unsigned. With
    # API keys each delivery is signed with its key's sha256 hex, never with this. A secret: never logged.
    job_webhook_secret: str | None = Field(
        None,
        min_length=16,
        description="Signs the webhooks of jobs submitted without authentication (with API keys each key's "
        "sha256 hex signs); none: unsigned. A secret: never logged.",
    )
    # Attempts per delivery: a 5xx, a time-out or no connection is retried after job_webhook_retry_base_s,
    # doubled each time (capped at 15 min, jittered): the default 8 spans about 10 min of receiver outage.
    job_webhook_max_attempts: int = Field(
        8,
        ge=1,
        le=100,
        description="Attempts per webhook delivery (a 5xx, a time-out or no connection is retried).",
    )
    job_webhook_retry_base_s: float = Field(
        5.0,
        gt=0,
        le=900,
        description="Seconds before a webhook's first retry, doubled for each next one (capped at 15 min, "
        "jittered).",
    )
    # Per attempt, connect to last byte: a receiver should answer at once and do its work afterwards.
    job_webhook_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Seconds per webhook attempt, connect to last byte."
    )

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

    @property
    def job_pages_idle(self) -> bool:
        """Job pages run at nice 19, on workers of their own (decode, and rapidocr's instances)."""
        return bool(self.database_url) and self.job_idle_priority

    def for_engine(self, engine: str) -> Settings:
        """These settings with the defaults that depend on the engine (once resolved) filled in."""
        n = self.max_concurrency or (
            self.vllm_max_num_seqs if engine == "vllm" else max(2, self.rapidocr_workers)
        )
        defaults = {
            "max_concurrency": n,
            "job_max_inflight": n,
            "job_max_interactive": self.vllm_max_num_seqs // 2 if engine == "vllm" else 0,
        }
        update = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return self.model_copy(update=update) if update else self

    @model_validator(mode="after")
    def _vllm_is_consistent(self) -> Settings:
        if self.engine == "vllm" and self.model_path is None:
            raise ValueError("model_path is required for engine vllm")
        if self.vllm_max_tokens > self.vllm_max_tokens_cap:
            raise ValueError("vllm_max_tokens must not exceed vllm_max_tokens_cap")
        if self.vllm_max_tokens_cap + VLLM_PAGE_TOKENS > self.vllm_max_model_len:
            raise ValueError(
                f"vllm_max_model_len must hold a page ({VLLM_PAGE_TOKENS} tokens at 1540 px) "
                "plus vllm_max_tokens_cap"
            )
        if any(not 0.0 <= t <= 2.0 for t in self.vllm_retry_temperatures):
            raise ValueError("vllm_retry_temperatures must lie between 0 and 2")
        return self

    @model_validator(mode="after")
    def _auth_is_explicit(self) -> Settings:
        if self.api_keys_file is None and not self.auth_disabled:
            raise ValueError(
                "api_keys_file is required (set auth_disabled: true to run without authentication)"
            )
        return self

    @model_validator(mode="after")
    def _webhook_prefixes_are_urls(self) -> Settings:
        from .jobs.webhooks import prefix_problem  # httpx's parser: the one that sends the webhooks

        problems = [p for p in map(prefix_problem, self.job_webhook_allowed_urls) if p is not None]
        if problems:
            raise ValueError("job_webhook_allowed_urls: " + "; ".join(problems))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(settings)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown setting"
        hint = f" (env OCR_APP_{key.upper()})" if e["loc"] else ""
        lines.append(f"  {key}: {msg}{hint}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_settings(config_file: Path | str | None = None, **overrides: object) -> Settings:
    """Build Settings from (in rising priority) defaults, the YAML file, env vars, overrides."""
    if config_file is None and os.environ.get("OCR_APP_CONFIG"):
        config_file = os.environ["OCR_APP_CONFIG"]
    path = Path(config_file) if config_file else None
    if path is not None and not path.is_file():
        raise ConfigError(f"invalid configuration: config file {path} does not exist")
    token = _config_file.set(path)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    except (OSError, ValueError, yaml.YAMLError) as err:  # unreadable or malformed YAML
        raise ConfigError(f"invalid configuration: {path}: {err}") from None
    finally:
        _config_file.reset(token)
