"""Logs: native journal entries under systemd, JSON lines on stdout elsewhere. Never document bytes, never
OCR text, never keys.

Under systemd (JOURNAL_STREAM names our stdout or stderr) each record becomes one journal entry: PRIORITY from
the level, a short MESSAGE for people, and every structured value as a field of its own (REQUEST_ID, CALLER,
ROUTE, STATUS, DURATION_MS, PAGES, ...) that `journalctl REQUEST_ID=...` selects and `-o verbose` shows. The
native protocol itself (encoding, large entries through a memfd, reconnecting to a restarted journald) is
logging-journald's JournaldTransport; which fields an entry has is decided here.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from contextvars import ContextVar
from pathlib import Path

from pythonjsonlogger.json import JsonFormatter

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# syslog(3) priorities, as journald's PRIORITY field and `journalctl -p` use them.
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}
# What a LogRecord carries about itself; anything else on a record is a structured value of ours.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_FIELD_NAME = re.compile(r"[^A-Z0-9_]")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)  # uvicorn's ANSI-coloured duplicate of msg
        if not hasattr(record, "request_id"):
            rid = request_id_var.get()
            if rid is not None:
                record.request_id = rid
        return True


def structured(record: logging.LogRecord) -> dict[str, object]:
    """The record's structured values (the `extra=` of the call, the request id), None ones left out."""
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and v is not None}


def summary(record: logging.LogRecord, values: dict[str, object] | None = None) -> str:
    """The line a person reads: the access record as `POST /v1/ocr 200 1.6 s 1 page caller=fleet`.
    `values`: the record's structured(), when the caller has it already."""
    f = structured(record) if values is None else values
    if record.name != "ocr_app.access" or "route" not in f:
        return record.getMessage()
    parts = [str(f.get("method", "")), str(f["route"]), str(f.get("status", ""))]
    if "duration_ms" in f:
        ms = float(f["duration_ms"])  # type: ignore[arg-type]
        parts.append(f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:g} ms")
    if "pages" in f:
        parts.append(f"{f['pages']} page" + ("" if f["pages"] == 1 else "s"))
    parts += [f"{k}={f[k]}" for k in ("caller", "error") if k in f]
    return " ".join(p for p in parts if p)


def journal_fields(record: logging.LogRecord, identifier: str) -> list[tuple[str, object]]:
    """One journal entry: PRIORITY, MESSAGE, SYSLOG_IDENTIFIER, the code location, then each structured value
    under its upper-cased name (journald allows A-Z, 0-9 and '_', not leading)."""
    values = structured(record)
    fields: list[tuple[str, object]] = [
        ("MESSAGE", summary(record, values)),
        ("PRIORITY", _PRIORITY.get(record.levelno, 6)),
        ("SYSLOG_IDENTIFIER", identifier),
        ("LOGGER", record.name),
        ("CODE_FILE", record.pathname),
        ("CODE_LINE", record.lineno),
        ("CODE_FUNC", record.funcName),
    ]
    if record.exc_info:
        fields.append(("TRACEBACK", "".join(traceback.format_exception(*record.exc_info))))
    taken = {n for n, _ in fields}
    for key, value in values.items():
        name = _FIELD_NAME.sub("_", key.upper()).lstrip("_")
        if name and name not in taken:
            taken.add(name)
            fields.append((name, value if isinstance(value, int | float | str) else str(value)))
    return fields


class JournalHandler(logging.Handler):
    def __init__(self, identifier: str):
        super().__init__()
        from logging_journald import JournaldTransport

        self.identifier = identifier
        self.transport = JournaldTransport()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.transport.send(journal_fields(record, self.identifier))
        except Exception:  # a log line must never take a request down
            self.handleError(record)


def under_journald() -> bool:
    """True when systemd connected our stdout or stderr to the journal (it says so in JOURNAL_STREAM)."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not ino:
        return False
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (str(st.st_dev), str(st.st_ino)) == (dev, ino):
            return True
    return False


def unit_identifier(default: str = "ocr-app") -> str:
    """Our unit's name without `.service` (ocr-app@0), as its SyslogIdentifier= names the stdout lines."""
    try:
        last = Path("/proc/self/cgroup").read_text().strip().rsplit("/", 1)[-1]
    except OSError:
        return default
    return last.removesuffix(".service") if last.endswith(".service") else default


def setup_logging(level: str = "info") -> None:
    handler: logging.Handler | None = None
    if under_journald():
        try:
            handler = JournalHandler(unit_identifier())
        except OSError as err:  # journald's socket missing or refusing: stdout still reaches the journal
            print(f"journald's native socket unusable ({err}): logging JSON to stdout", file=sys.stderr)
    if handler is None:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(
            JsonFormatter(
                "{levelname}{name}{message}",
                style="{",
                timestamp="time",  # ISO 8601, UTC
                rename_fields={"levelname": "level", "name": "logger"},
                json_ensure_ascii=False,
            )
        )
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own loggers go through ours; its access log is replaced by our request line.
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
