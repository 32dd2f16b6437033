"""The app served by uvicorn, as `ocr-app serve` runs it: a stop signal drains (/healthz says draining while
in-flight work finishes, then a clean exit 0); an engine that becomes unusable stops the server and makes
the exit status 1, for systemd to restart the instance."""

from __future__ import annotations

import math
from types import FrameType

import uvicorn

from ..config import Settings
from .app import create_app
from .state import AppState


class Service:
    def __init__(self, settings: Settings):
        self.fatal: list[str] = []
        app = create_app(settings, on_fatal=self._on_fatal)
        self.server = _Server(
            app.state.ocr,
            uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                log_config=None,
                access_log=False,
                proxy_headers=False,
                server_header=False,
                timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
                timeout_keep_alive=75,  # longer than nginx's upstream keepalive_timeout (60 s)
            ),
        )

    def _on_fatal(self, reason: str) -> None:
        self.fatal.append(reason)
        self.server.should_exit = True

    def run(self) -> int:
        """Serve until stopped; the exit status."""
        self.server.run()
        return 1 if self.fatal else 0


class _Server(uvicorn.Server):
    def __init__(self, state: AppState, config: uvicorn.Config):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.state.stopping = True  # /healthz says draining while in-flight work finishes
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after a graceful stop; a clean stop exits 0 instead.
        self._captured_signals.clear()
