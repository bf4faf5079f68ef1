"""schemathesis against the live API (the session's broker, no pipeline up, so changes are
queued on a control topic of this test's own): no 5xx, every response is as the OpenAPI
document says (status code, content type, body schema). A bounded number of examples per
operation; the SSE tail (a stream without end) is tested in tests/test_api.py."""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.app import ApiConfig, ApiThread
from services.api.openapi import openapi_document
from services.stream.kafka import KafkaSettings

TOKEN = "schemathesis-token"
schema = schemathesis.openapi.from_dict(openapi_document()).exclude(path_regex="/tail$")


@pytest.fixture(scope="module")
def api(kafka_bootstrap):
    config = ApiConfig(KafkaSettings(kafka_bootstrap, session_timeout_ms=2000),
                       topic_prefix=f"fuzz{uuid.uuid4().hex[:8]}", token=TOKEN, timeout_s=2)
    with ApiThread(config) as running:
        yield running


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_answers_as_its_openapi_document_says(case, api):
    case.call_and_validate(base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"},
                           checks=[not_a_server_error, status_code_conformance,
                                   content_type_conformance, response_schema_conformance],
                           timeout=30)
