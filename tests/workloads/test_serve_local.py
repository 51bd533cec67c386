"""The stack's serveConfigV2, deployed on CPU for real and queried with the official client.

One server for the whole module (``serve_fixtures.local_server``): a cold start costs ~1.5 min.
The fault test runs last: it kills the LLM replica and waits for Serve to bring it back.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.workloads import serve_fixtures as fx
from workloads.serve import local

pytestmark = pytest.mark.serve
local_server = fx.local_server


@pytest.fixture
def client(local_server: fx.LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=local_server.endpoint, api_key="unused", timeout=120)


def test_the_cli_printed_the_endpoint_and_every_cpu_change(local_server: fx.LocalServer) -> None:
    log = local_server.log_text()
    assert local_server.endpoint.startswith("http://127.0.0.1:")
    assert local_server.endpoint.endswith("/v1")
    for change in ("removed accelerator_type 'TPU-V6E'", "{'kind': 'cpu'}", "model_source"):
        assert change in log


def test_models_lists_the_served_model(client: openai.OpenAI, local_server: fx.LocalServer) -> None:
    assert [m.id for m in client.models.list().data] == [local_server.model_id]


def test_chat_completion_is_greedy_and_repeatable(
    client: openai.OpenAI, local_server: fx.LocalServer
) -> None:
    def ask() -> Any:
        return client.chat.completions.create(
            model=local_server.model_id,
            messages=[{"role": "user", "content": "What is a TPU?"}],
            max_tokens=8,
            temperature=0.0,
        )

    first, second = ask(), ask()
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].message.content
    assert first.choices[0].finish_reason in ("length", "stop")
    assert 0 < first.usage.completion_tokens <= 8
    assert first.usage.prompt_tokens > 5  # the chat template wrapped the message
    assert second.choices[0].message.content == first.choices[0].message.content


def test_streamed_completion_arrives_in_pieces(
    client: openai.OpenAI, local_server: fx.LocalServer
) -> None:
    stream = client.completions.create(
        model=local_server.model_id,
        prompt="the model serves tokens",
        max_tokens=12,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(pieces) >= 2, chunks
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    whole = client.completions.create(
        model=local_server.model_id,
        prompt="the model serves tokens",
        max_tokens=12,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert "".join(pieces) == whole.choices[0].text


def test_streamed_chat_completion(client: openai.OpenAI, local_server: fx.LocalServer) -> None:
    stream = client.chat.completions.create(
        model=local_server.model_id,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def test_unknown_model_is_a_clear_4xx_and_the_server_keeps_serving(
    client: openai.OpenAI, local_server: fx.LocalServer
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert caught.value.status_code == 404
    # Ray's ingress answers FastAPI's {"detail": ...}, not OpenAI's {"error": ...}: read the body.
    assert "no-such-model" in caught.value.response.text
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=local_server.model_id, prompt="hi", max_tokens=-2)
    assert "max_tokens" in str(bad.value)
    assert not local.probe(local_server.endpoint, "no-such-model")
    assert local.probe(local_server.endpoint, local_server.model_id)


def test_concurrent_requests_all_succeed(
    client: openai.OpenAI, local_server: fx.LocalServer
) -> None:
    def one(i: int) -> int:
        reply = client.completions.create(
            model=local_server.model_id,
            prompt=f"request {i}",
            max_tokens=8,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None
        return reply.usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(16))) == [8] * 16


def test_smoke_helper_answers_a_chat(local_server: fx.LocalServer) -> None:
    assert local.smoke(local_server.endpoint, local_server.model_id)


# --- fault: the LLM replica dies under load ------------------------------------------------

FAULT_CLIENTS = 2
FAULT_GOAL = 0.99
FAULT_LIMIT_S = 360
FAULT_AFTER_S = 3  # the clients keep going this long after the first success on the new replica


def test_replica_killed_under_load_is_replaced_and_requests_succeed(
    local_server: fx.LocalServer, record_property: Any
) -> None:
    """Kill the LLMServer replica actor while clients stream requests; Serve starts a new one.

    Each request is one logical call of the official client, which retries 5xx and connection
    errors (``max_retries=3``): requests in flight on the dead replica fail with 500 and are
    retried; new ones queue in Serve until the new replica has loaded the model (~1 min).
    """
    server_errors = []  # raw 5xx responses seen by the client, before its retries

    def on_response(response: Any) -> None:
        if response.status_code >= 500:
            server_errors.append(response.status_code)

    client = openai.OpenAI(
        base_url=local_server.endpoint,
        api_key="unused",
        max_retries=3,
        timeout=240,
        http_client=openai.DefaultHttpxClient(event_hooks={"response": [on_response]}),
    )
    results: list[tuple[float, float, bool, str]] = []  # start, end, ok, error
    stop = threading.Event()

    def worker(n: int) -> None:
        while not stop.is_set():
            start = time.monotonic()
            try:
                client.completions.create(
                    model=local_server.model_id, prompt=f"client {n}", max_tokens=4
                )
                results.append((start, time.monotonic(), True, ""))
            except openai.APIError as e:
                results.append((start, time.monotonic(), False, repr(e)[:200]))

    threads = [
        threading.Thread(target=worker, args=(n,), daemon=True) for n in range(FAULT_CLIENTS)
    ]
    for t in threads:
        t.start()
    # Under load before the kill: the clients' requests are coming back.
    flowing = time.monotonic() + 120
    while len(results) < FAULT_CLIENTS and time.monotonic() < flowing:
        time.sleep(0.1)
    assert len(results) >= FAULT_CLIENTS, f"no load before the kill: {results}"
    killed = fx.ray_driver(fx.KILL_REPLICA, local_server.ray_address)
    killed_at = time.monotonic()
    deadline = killed_at + FAULT_LIMIT_S

    def recovered_at() -> float | None:
        after = [end for start, end, ok, _ in results if ok and start > killed_at + 1]
        return min(after) if after else None

    while time.monotonic() < deadline and (
        recovered_at() is None or time.monotonic() < (recovered_at() or 0) + FAULT_AFTER_S
    ):
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=250)

    replicas = fx.ray_driver(fx.LIST_REPLICAS, local_server.ray_address).split()
    ok = sum(1 for r in results if r[2])
    share = ok / max(1, len(results))
    report = {
        "requests": len(results),
        "succeeded": ok,
        "share": round(share, 4),
        "raw_5xx_before_retries": len(server_errors),
        "recovery_s": round((recovered_at() or float("nan")) - killed_at, 1),
        "slowest_request_s": round(max(end - start for start, end, _, _ in results), 1),
        "killed": killed,
        "replicas_after": replicas,
    }
    print("\n[serve fault] " + json.dumps(report))
    record_property("serve_fault", json.dumps(report))
    local_server.notes["fault"] = report

    assert recovered_at() is not None, f"no request succeeded after the kill: {report}"
    assert killed not in replicas and len(replicas) == 1, report
    assert share >= FAULT_GOAL, report
    assert local.probe(local_server.endpoint, local_server.model_id)
