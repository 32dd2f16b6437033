"""The whole API fuzzed from its own OpenAPI document (schemathesis, property-based): whatever a client sends,
fitting the schema or not (random bodies of every declared content type, multipart, query parameters), the
answer is never a 5xx and every error is the JSON error shape with the request's id.

Schemathesis' strategies drive Hypothesis directly (its pytest plugin's lazy fixtures do not run on this
pytest); the test prints how many requests it sent to each operation.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

# (operation, generation mode): cases. The probes take no input, so nothing can be generated against them.
EXAMPLES = {
    ("POST /v1/ocr", GenerationMode.POSITIVE): 500,
    ("POST /v1/ocr", GenerationMode.NEGATIVE): 500,
    ("GET /healthz", GenerationMode.POSITIVE): 20,
    ("GET /livez", GenerationMode.POSITIVE): 20,
}
SENT: dict[str, int] = {}


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


@pytest.mark.parametrize(("label", "mode"), list(EXAMPLES), ids=lambda x: str(x))
def test_no_input_gets_a_server_error_or_a_bare_error(api_schema, server, label, mode):
    method, path = label.split(" ", 1)
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES[label, mode], deadline=None, suppress_health_check=list(HealthCheck))
    def one(case):
        # With the key (what any client holding one can send) unless the case brings its own Authorization.
        r = case.call(base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}, timeout=60)
        SENT[label] = SENT.get(label, 0) + 1
        assert r.status_code < 500, f"{label} answered {r.status_code}: {r.text[:500]}"
        if r.status_code >= 400:
            error = r.json()["error"]
            assert set(error) >= {"code", "message", "request_id"}, error
            assert [error["request_id"]] == r.headers["x-request-id"], (error, r.headers)  # a list per name

    one()


def test_the_fuzzing_reached_every_operation():
    print(f"\nfuzz requests sent: {sum(SENT.values())} {SENT}")
    assert set(SENT) == {label for label, _ in EXAMPLES}, SENT
    assert SENT["POST /v1/ocr"] >= 1000, SENT
