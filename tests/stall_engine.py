"""`ocr-app` with an engine that a test can wedge or make block the event loop; for tests only.

Run as `python tests/stall_engine.py <ocr-app arguments>` with `engine: rapidocr` in the config and env
STALL_CONTROL naming a directory. At start-up, load() waits while `hold_load` exists there (the instance
stays `loading`). On each request, recognize() looks there:

- `block_loop` (a number of seconds): sleeps that long *synchronously*, on the event loop, then goes on;
  the file is removed first, so it happens once;
- `wedge`: waits (without blocking the loop) while the file exists, finishing no page;
- `trickle` (a number of seconds): each page takes that long (a slow engine that still makes progress);
- `hold_interactive`: an interactive request's pages wait while the file exists (a bulk job's go on);
- `wedge_after` (a number N): once the engine has read N pages (`ocr_engine_pages_total`), each further
  page waits while the file exists (page N + 1 is then in flight, and stays so);
- `hold_width` (a number W): a page W pixels wide as sent waits while the file exists (one job held
  running, the others read).
- `stream` (JSON `{"pieces": [...], "lines": [...]}`): each page is written as a generative engine writes
  it: the pieces given to recognize()'s `stream` one by one, then the page read as `lines`; with
  `wedge_streamed` there too, the page then waits while that file exists.

Otherwise every page reads back the self-test text at once.

With env STALL_HOSTS naming a JSON file `{"name": ["address", ...]}`, names are resolved from it (read at
each lookup; a name not in it does not resolve) instead of the system's resolver: ocr_app/egress.py's
RESOLVER, what a document URL's or a webhook's host is looked up with. Each lookup is appended to the file
+ ".log".

With env STALL_LOOPBACK_ONLY set, what the app fetches for a client (a document URL, an image URL, a webhook)
never leaves the machine: httpcore's network backend, which the request-forgery guard connects with once it
has checked the address, fails a connection to any address but loopback as an unreachable one (ConnectError)
before any socket is opened; a public address the guard lets through gets the app's fetch failure.

Everything else (settings, the CLI, the HTTP app, the decode pool) is the app's own: only the class behind
`engine: rapidocr`, the resolver and (STALL_LOOPBACK_ONLY) httpcore's connect are replaced, in this process,
so nothing of it can reach a release.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import sys
import time
from pathlib import Path

import httpcore

import ocr_app.egress
import ocr_app.engines.rapidocr.engine
from ocr_app.cli import main
from ocr_app.engines.base import SELF_TEST_TEXT, Engine, EngineLine, EnginePage


class StallEngine(Engine):
    name = "rapidocr"
    model = "stall-test"

    def __init__(self, **_settings):
        self.control = Path(os.environ["STALL_CONTROL"])

    async def load(self) -> None:
        while (self.control / "hold_load").exists():  # noqa: ASYNC110 - a test removes it
            await asyncio.sleep(0.05)

    async def recognize(self, pages, max_tokens=None, background=False, stream=None):
        block = self.control / "block_loop"
        if block.exists():
            seconds = float(block.read_text())
            block.unlink()
            time.sleep(seconds)  # noqa: ASYNC251 - on the event loop: what a slow synchronous path does
        while (self.control / "wedge").exists():  # noqa: ASYNC110 - another process removes it
            await asyncio.sleep(0.05)
        while not background and (self.control / "hold_interactive").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        trickle = self.control / "trickle"
        per_page = float(trickle.read_text()) if trickle.exists() else 0.0
        out = []
        wedge_after = self.control / "wedge_after"
        hold_width = self.control / "hold_width"
        streamed = self.control / "stream"
        written = json.loads(streamed.read_text()) if streamed.exists() else None
        for i, page in enumerate(pages):
            if written is not None:
                for piece in written["pieces"]:
                    if stream is not None:
                        stream(i, piece)
                    await asyncio.sleep(0)  # each piece its own turn of the loop, as a model's tokens are
                while (self.control / "wedge_streamed").exists():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                out.append(EnginePage(lines=[EngineLine(t, None, 1.0) for t in written["lines"]]))
                self._page_done()
                continue
            await asyncio.sleep(per_page)
            while hold_width.exists() and page.width == int(hold_width.read_text() or 0):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            while wedge_after.exists() and self.pages_done >= int(wedge_after.read_text() or 0):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            out.append(EnginePage(lines=[EngineLine(SELF_TEST_TEXT, None, 1.0)]))
            self._page_done()
        return out


# create_engine imports RapidOcrEngine from this module when it is called: it gets the stand-in.
ocr_app.engines.rapidocr.engine.RapidOcrEngine = StallEngine  # type: ignore[misc]


def _lookup(host: str) -> list[str]:
    hosts = Path(os.environ["STALL_HOSTS"])
    with open(f"{hosts}.log", "a") as log:
        log.write(host + "\n")
    found = json.loads(hosts.read_text()).get(host)
    if not found:
        raise OSError(f"{host}: not in {hosts.name}")
    return list(found)


async def hosts_file_resolver(host: str, port: int) -> list[str]:
    return _lookup(host)  # a small local file: as quick as the lookup it stands for


if os.environ.get("STALL_HOSTS"):
    ocr_app.egress.RESOLVER = hosts_file_resolver


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:  # a name: the guard resolved it already, so no connection is made to a name
        return False


_CONNECT_TCP = httpcore.AnyIOBackend.connect_tcp


async def _loopback_connect_tcp(self, host: str, port: int, *args, **kwargs) -> httpcore.AsyncNetworkStream:
    if not _loopback(host):
        raise httpcore.ConnectError(f"{host}: only loopback is reached here (STALL_LOOPBACK_ONLY)")
    return await _CONNECT_TCP(self, host, port, *args, **kwargs)


if os.environ.get(
    "STALL_LOOPBACK_ONLY"
):  # httpcore's backend: what the guard (ocr_app/egress.py) connects with
    httpcore.AnyIOBackend.connect_tcp = _loopback_connect_tcp  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
