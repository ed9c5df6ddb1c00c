"""schemathesis over `fak serve`'s own OpenAPI schema (synthetic model, bounded examples): no 5xx,
and every response matches the schema."""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")

import schemathesis  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from support.serve_helpers import Server  # noqa: E402

pytestmark = [pytest.mark.serve, pytest.mark.slow]


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    s = Server("--gguf", "synthetic", "--max-model-len", "160")  # bounded: no example may generate 16 x 4096
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def api_schema(server: Server):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))  # same cases each run
def test_no_5xx_and_responses_match_the_schema(case, server: Server) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(base_url=server.url, checks=[not_a_server_error, response_schema_conformance], timeout=60)
