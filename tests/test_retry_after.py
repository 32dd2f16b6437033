"""Retry-After as the clients read it (`jobclient.retry_after_s`: `ocr-app jobs`, the folder submission and
the OCRmyPDF plugin): RFC 9110's two forms, a cap, and anything else ignored rather than a crash."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from ocr_app.fleet import ocrmypdf_plugin as plugin
from ocr_app.fleet.jobclient import retry_after_s

NOW = datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC)


def answer(value: str) -> httpx.Response:
    # As bytes, as from the wire: a byte past ASCII (latin-1 "²") is what httpx then decodes.
    return httpx.Response(503, headers={"Retry-After": value.encode("latin-1")})


@pytest.mark.parametrize(
    ("value", "wait"), [("0", 0.0), ("29", 29.0), ("30", 30.0), ("31", 30.0), (" 7 ", 7.0)]
)
def test_seconds_up_to_the_cap_and_one_past_it(value, wait):
    assert retry_after_s(answer(value), 30.0, NOW) == wait


@pytest.mark.parametrize(("after", "wait"), [(7, 7.0), (30, 30.0), (31, 30.0), (-5, 0.0)])
def test_an_http_date_is_the_time_until_it(after, wait):
    # The date written by the standard library's own HTTP-date writer (GMT, second precision).
    date = format_datetime(NOW + timedelta(seconds=after), usegmt=True)
    assert retry_after_s(answer(date), 30.0, NOW) == wait


@pytest.mark.parametrize("value", ["", "²", "1.5", "-1", "soon", "Sun, 99 Foo 2026 10:00:00 GMT"])
def test_anything_else_is_no_wait_said(value):
    assert retry_after_s(answer(value), 30.0, NOW) is None
    assert retry_after_s(httpx.Response(503), 30.0, NOW) is None


def test_the_plugin_falls_back_to_its_own_pause_on_a_retry_after_it_cannot_read():
    page = '<div class="ocr_page" id="page_1" title="bbox 0 0 5 3; ppageno 0">'
    answers = [answer("²"), answer("²"), httpx.Response(200, text=page)]
    client = httpx.Client(base_url="http://fleet", transport=httpx.MockTransport(lambda _: answers.pop(0)))
    slept: list[float] = []
    assert plugin.read_page(client, b"page", retries=3, sleep=slept.append) == page
    assert slept == [0.5, 1.0]  # doubling from 0.5 s, as when no Retry-After is given
