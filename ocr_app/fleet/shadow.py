"""Shadow comparison for canary upgrades: a sample of the requests this instance answered, replayed to the
canary and the two texts compared.

The ocr_app role's `shadow` entry point writes the control file (settings.shadow_file), JSON
`{"url": "https://<canary>/v1/ocr", "share": 0.25}`; while it exists, `share` of this instance's 200 answers
are sent again to `url` once their client has its answer (the client only ever gets ours: OCR is a pure
function of the document, so a replay changes nothing). The canary's text is compared with ours as
`ocr-app eval` compares (whitespace ignored), and only figures remain: the ocr_shadow_* counters. Nothing of a
document is kept beyond its replay, and no log line holds a text, a document or a key.

With `shadow_route: chat` the replay goes through the canary's OpenAI-compatible route instead: the document
as one `data:` image to /v1/chat/completions (the control file's url with its path replaced), and the answer's
Markdown compared with ours rendered as that route renders it (ocr_app/ocr/formats/markdown.py), page by
page. A request the chat route cannot say (a multipart body, a `pages=` selection) is replayed as with `ocr`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import ssl
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter
from rapidfuzz.distance import Levenshtein

from ..config import Settings
from ..ocr.formats import markdown
from ..schemas import OcrResponse
from .evaluation import squeeze

log = logging.getLogger("ocr_app.shadow")

# Marks a replay (the canary's access log shows it); a replay is never replayed again.
SHADOW_HEADER = "X-OCR-Shadow"
OUTCOMES = ("compared", "failed", "busy", "skipped")


@dataclass(frozen=True)
class Offer:
    """A request this instance answered with 200, as it can be sent again."""

    body: bytes  # as read
    content_type: str  # as sent (a multipart body's boundary is in it)
    query: tuple[tuple[str, str], ...]  # preview left out: the canary renders no page images for us
    auth: dict[str, str]  # the caller's key headers, as sent
    request_id: str
    answer: OcrResponse


@dataclass(frozen=True)
class _Target:
    url: str
    share: float


def _parse_control(text: str) -> _Target:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    url, share = data.get("url"), data.get("share")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError("url: not an http(s) URL")
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
        raise ValueError("share: not a number from 0 to 1")
    return _Target(url, float(share))


class Shadow:
    def __init__(self, settings: Settings, registry: CollectorRegistry):
        self.settings = settings
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stamp: object = None  # the control file's (inode, size, mtime) as last read
        self._target: _Target | None = None
        # In the app's registry (ocr_app/metrics.py); each outcome at 0 from the start, so that rate() sees
        # the first replay of a canary step.
        self.requests = Counter(
            "ocr_shadow_requests",
            "Requests sampled for a replay to the canary, by outcome: compared, failed (no answer, or a "
            "status but 200/429/503), busy (the canary answered 429/503), skipped (shadow_max_inflight full)",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.reference_chars = Counter(
            "ocr_shadow_reference_chars",
            "Characters (whitespace ignored) of this instance's answers to the compared replays",
            registry=registry,
        )
        self.edit_distance = Counter(
            "ocr_shadow_edit_distance",
            "Edits from this instance's text to the canary's over the compared replays (x 100 / "
            "ocr_shadow_reference_chars: the text difference in %)",
            registry=registry,
        )

    def _connect(self) -> bool:
        """The replays' client, made when a control file first turns replays on (not at start: on a host
        being set up the fleet CA may come after the app). A CA file that cannot be loaded turns replays off
        until the control file changes: it is no reason for the service itself to fail."""
        if self._client is not None:
            return True
        verify: ssl.SSLContext | bool = True
        if self.settings.shadow_ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=str(self.settings.shadow_ca_file))
            except (OSError, ssl.SSLError) as err:
                log.warning(
                    "shadow replays off: cannot load shadow_ca_file",
                    extra={"file": str(self.settings.shadow_ca_file), "error": type(err).__name__},
                )
                return False
        # trust_env=False: a proxy from the environment is no way to the canary.
        self._client = httpx.AsyncClient(
            verify=verify, timeout=self.settings.request_timeout_s + 10.0, trust_env=False
        )
        return True

    async def close(self) -> None:
        """Replays in flight are dropped: a stop never waits for them."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def target(self) -> _Target | None:
        """The control file's target, re-read when the file changed (a stat per call)."""
        path = self.settings.shadow_file
        assert path is not None
        try:
            st = os.stat(path)
            stamp: object = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError as err:
            stamp = ("error", err.errno)
        if stamp == self._stamp:
            return self._target
        self._stamp, before = stamp, self._target
        self._target = None
        if stamp is None:
            if before is not None:
                log.info("shadow replays off (no control file)")
            return None
        try:
            self._target = _parse_control(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as err:  # logged once per version of the file
            why = {"file": str(path), "error": str(err)}
            log.warning("shadow replays off: invalid control file", extra=why)
            return None
        if not self._connect():
            self._target = None
            return None
        log.info("shadow replays on", extra={"target": self._target.url, "share": self._target.share})
        return self._target

    def offer(self, offer: Offer) -> None:
        """After the client got its answer: replay it to the canary if sampled and a replay slot is free."""
        if self.settings.shadow_file is None:
            return
        target = self.target()
        if target is None or self._client is None or random.random() >= target.share:  # noqa: S311 - a sample, not a secret
            return
        if len(self._tasks) >= self.settings.shadow_max_inflight:
            self.requests.labels("skipped").inc()  # never queued: no more load, no document held
            return
        task = asyncio.create_task(self._replay(target.url, offer), name="shadow-replay")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replay(self, url: str, offer: Offer) -> None:
        assert self._client is not None
        # The same request id: `journalctl REQUEST_ID=<id>` finds the request here and its replay there.
        headers = {
            **offer.auth,
            "Content-Type": offer.content_type,
            "X-Request-ID": offer.request_id,
            SHADOW_HEADER: "1",
        }
        figures: dict[str, object] = {}
        chat = self.settings.shadow_route == "chat" and _chat_sayable(offer)
        try:
            if chat:
                headers["Content-Type"] = "application/json"
                resp = await self._client.post(_chat_url(url), content=_chat_body(offer), headers=headers)
            else:
                resp = await self._client.post(url, content=offer.body, params=offer.query, headers=headers)
            figures["status"] = resp.status_code
            if resp.status_code in (429, 503):  # full or not ready: the canary's load, not its reading
                outcome = "busy"
            elif resp.status_code != 200:
                outcome = "failed"
            else:
                if chat:
                    ours = markdown.render(offer.answer).split(markdown.PAGE_BREAK)
                    theirs = str(resp.json()["choices"][0]["message"]["content"]).split(markdown.PAGE_BREAK)
                else:
                    ours = [p.text for p in offer.answer.pages]
                    theirs = [page["text"] for page in resp.json()["pages"]]
                edits, chars = await _compare(ours, theirs)
                self.reference_chars.inc(chars)
                self.edit_distance.inc(edits)
                outcome = "compared"
                figures |= {"edits": edits, "chars": chars}
        # No answer, or an answer that is no OcrResponse.
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            outcome = "failed"
            figures["error"] = type(err).__name__
        # Logged before it is counted: whoever watches the counter finds the line written.
        log.debug("shadow replay", extra={"outcome": outcome, **figures})
        self.requests.labels(outcome).inc()


def _chat_sayable(offer: Offer) -> bool:
    """A raw document without a page selection: what one chat image says."""
    return not offer.content_type.lower().startswith("multipart/") and all(
        k != "pages" for k, _ in offer.query
    )


def _chat_url(url: str) -> str:
    """The canary's chat route beside the control file's /v1/ocr."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path=parsed.path.removesuffix("/v1/ocr") + "/v1/chat/completions"))


def _chat_body(offer: Offer) -> bytes:
    media_type = offer.content_type.split(";")[0].strip()
    image = f"data:{media_type};base64,{base64.b64encode(offer.body).decode('ascii')}"
    body: dict[str, object] = {
        "model": "shadow",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}],
    }
    for key, value in offer.query:
        if key == "max_tokens" and value.isdigit():
            body["max_tokens"] = int(value)
    return json.dumps(body).encode()


async def _compare(ours: list[str], theirs: list[str]) -> tuple[int, int]:
    """Edits from our text to theirs and our text's length, whitespace ignored. Page by page (a page the other
    side lacks counts whole), yielding between pages: an edit distance holds the GIL for O(n*m/64), 0.5 s for
    two unrelated 100k-character texts, which would stall every request of the instance."""
    edits = chars = 0
    for a, b in zip_longest(ours, theirs, fillvalue=""):
        a, b = squeeze(a), squeeze(b)
        edits += Levenshtein.distance(a, b)
        chars += len(a)
        await asyncio.sleep(0)
    return edits, chars
