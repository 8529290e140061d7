"""Background Responses remembered by the gateway (background.py): bounded, per
principal, and the top-up that charges the reported usage beyond the estimate once."""

from __future__ import annotations

import json

from ingest.gateway.background import BackgroundResponses, response_id_of, top_up_fields
from ingest.taps import RequestInfo, TapResult
from schemas.records import UsageEvent
from schemas.usage import new_usage_event


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def estimate(**tokens: int) -> UsageEvent:
    return new_usage_event(
        provider="openai",
        api="openai-responses",
        model="o3-2025-04-16",
        secret_id="sk-openai",
        org_id="acme",
        gateway_id="test-gateway",
        input_tokens=tokens.get("input_tokens", 200_000),
        output_tokens=tokens.get("output_tokens", 3_000),
        usage_source="estimated",
        estimate_reason="no_usage: the response is queued",
        units={"web_search": 1},
    )


def reported(output_tokens: int, reasoning_tokens: int) -> TapResult:
    return TapResult(
        model="o3-2025-04-16",
        usage_source="reported",
        units={"web_search": 3},
        input_tokens=10,
        output_tokens=output_tokens,
        reasoning_tokens=reasoning_tokens,
    )


def test_the_top_up_is_what_the_reported_usage_exceeds_the_estimate_by() -> None:
    est = estimate()
    fields = top_up_fields(est, reported(output_tokens=5_000, reasoning_tokens=4_500))
    assert fields is not None
    event = new_usage_event(**fields)  # a valid UsageEvent
    assert event["event_id"] == est["event_id"] + ".final"
    assert event["charge_of"] == est["event_id"]
    assert (event["input_tokens"], event["output_tokens"]) == (0, 2_000)
    assert event["reasoning_tokens"] == 2_000  # a part within its total
    assert event["units"] == {"web_search": 2}  # one was charged already
    assert (event["org_id"], event["secret_id"], event["usage_source"]) == (
        "acme",
        "sk-openai",
        "reported",
    )
    covered = TapResult(model="o3", usage_source="reported", input_tokens=10, output_tokens=10)
    assert top_up_fields(est, covered) is None  # the estimate covers it: nothing more


def test_only_the_creating_principal_finds_a_response() -> None:
    responses = BackgroundResponses()
    responses.add("resp_1", org_id="acme", secret_id="sk-1", info=RequestInfo(), event=estimate())
    assert responses.get("resp_1", org_id="acme", secret_id="sk-1") is not None
    assert responses.get("resp_1", org_id="other", secret_id="sk-1") is None
    assert responses.get("resp_1", org_id="acme", secret_id="sk-2") is None
    assert responses.get("resp_2", org_id="acme", secret_id="sk-1") is None


def test_remembered_responses_are_bounded_in_count_and_age() -> None:
    clock = Clock()
    responses = BackgroundResponses(max_entries=3, ttl_s=60, clock=clock)
    for n in range(5):
        responses.add(
            f"resp_{n}", org_id="acme", secret_id="sk-1", info=RequestInfo(), event=estimate()
        )
    assert len(responses) == 3 and responses.forgotten == 2
    assert responses.get("resp_0", org_id="acme", secret_id="sk-1") is None
    clock.now = 61
    assert responses.get("resp_4", org_id="acme", secret_id="sk-1") is None
    assert len(responses) == 0 and responses.forgotten == 5
    done = {**estimate(), "usage_source": "reported"}
    responses.add("resp_9", org_id="acme", secret_id="sk-1", info=RequestInfo(), event=done)
    entry = responses.get("resp_9", org_id="acme", secret_id="sk-1")
    assert entry is not None and entry.settled  # it carried its usage: nothing to meter


def test_the_response_id_is_read_from_the_answer() -> None:
    body = json.dumps({"id": "resp_abc", "status": "queued", "usage": None}).encode()
    assert response_id_of(body) == "resp_abc"
    assert response_id_of(b'{"id": "chatcmpl-1"}') is None
    assert response_id_of(b'{"id": 5}') is None
    assert response_id_of(b"not json") is None
    assert response_id_of(json.dumps({"id": "resp_" + "x" * 300}).encode()) is None


def test_the_response_id_is_read_from_the_first_events_of_a_stream() -> None:
    created = {"type": "response.created", "response": {"id": "resp_s1", "status": "queued"}}
    delta = {"type": "response.output_text.delta", "delta": '"response": {"id": "resp_x"}'}
    stream = (
        b"event: response.output_text.delta\ndata: " + json.dumps(delta).encode() + b"\n\n"
        b"event: response.created\r\ndata: " + json.dumps(created).encode() + b"\r\n\r\n"
    )
    assert response_id_of(stream, streamed=True) == "resp_s1"
    assert response_id_of(stream[:-4], streamed=True) is None  # unfinished: not read
    assert response_id_of(b"data: [DONE]\n\n", streamed=True) is None
