"""workloads/ready_gate.py against a fake Kubernetes API server on 127.0.0.1: CRDs that appear
late, a CRD never Established (fails by its deadline, naming it), a webhook the API server
cannot call (retried) and one that answers. Nothing leaves loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workloads import ready_gate

CRD = "rayjobs.ray.io"
QUEUES = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
PROBE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "spec": {}}
REFUSED = (
    'Internal error occurred: failed calling webhook "vclusterqueue.kb.io": failed to call '
    'webhook: Post "https://kueue-webhook-service.kueue-system.svc:443/validate": dial tcp '
    "10.8.0.4:9443: connect: connection refused"
)

Reply = tuple[int, dict]


class FakeApi:
    """Answers each (method, path) from a script: a list of replies, the last one repeated."""

    def __init__(self, script: dict[tuple[str, str], list[Reply]]):
        self.script = script
        self.seen: list[tuple[str, str, str, dict]] = []  # method, path, auth, body

    def answer(self, method: str, path: str, auth: str, body: dict) -> Reply:
        self.seen.append((method, path, auth, body))
        replies = self.script.get((method, path), [(404, {"kind": "Status", "reason": "NotFound"})])
        return replies.pop(0) if len(replies) > 1 else replies[0]


@pytest.fixture
def serve() -> Iterator[Callable[[FakeApi], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(api: FakeApi) -> str:
        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                auth = self.headers.get("Authorization", "")
                status, payload = api.answer(self.command, self.path, auth, body)
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _reply

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def account(tmp_path: Path) -> str:
    (tmp_path / "token").write_text("gate-token\n")
    return str(tmp_path)


def crd(established: str | None) -> Reply:
    conditions = [{"type": "NamesAccepted", "status": "True"}]
    if established is not None:
        conditions.append({"type": "Established", "status": established})
    return 200, {"kind": "CustomResourceDefinition", "status": {"conditions": conditions}}


def wait(checks, url: str, account: str, deadline_s: float = 5.0) -> tuple[float, list[str]]:
    said: list[str] = []
    waited = ready_gate.wait_ready(
        checks,
        ready_gate.Api(url, account),
        deadline_s=deadline_s,
        poll_s=0.01,
        say=said.append,
    )
    return waited, said


def test_crd_absent_then_established_returns(serve, account):
    path = ready_gate.CRD_PATH + CRD
    absent = (404, {"kind": "Status", "reason": "NotFound"})
    api = FakeApi({("GET", path): [absent, absent, crd("False"), crd("True")]})
    _, said = wait([ready_gate.crd_established(CRD)], serve(api), account)
    assert [p for _, p, _, _ in api.seen] == [path] * 4
    assert {auth for _, _, auth, _ in api.seen} == {"Bearer gate-token"}  # the pod's token
    assert said[0].startswith(f"waiting: CRD {CRD}: absent")
    assert said[-1].startswith(f"ready: CRD {CRD}: Established")


def test_crd_never_established_fails_by_its_deadline_naming_it(serve, account):
    api = FakeApi({("GET", ready_gate.CRD_PATH + CRD): [crd("False")]})
    with pytest.raises(ready_gate.NotReady) as err:
        wait([ready_gate.crd_established(CRD)], serve(api), account, deadline_s=0.3)
    message = str(err.value)
    assert f"CRD {CRD}: not ready after" in message
    assert "the gate's bound (0s)" in message
    assert "not Established yet" in message
    assert len(api.seen) > 2  # polled until the bound, not once


def test_webhook_the_api_server_cannot_call_is_retried_then_passes(serve, account):
    path = f"{QUEUES}?dryRun=All"
    refused = (500, {"kind": "Status", "reason": "InternalError", "message": REFUSED})
    created = (201, {**PROBE, "metadata": {"name": "park-ready-probe-x"}})
    api = FakeApi({("POST", path): [refused, refused, created]})
    check = ready_gate.dry_run_answered(QUEUES, PROBE)
    _, said = wait([check], serve(api), account)
    assert len(api.seen) == 3
    assert all(body == PROBE for _, _, _, body in api.seen)  # the object itself, dry run only
    assert "connection refused" in said[0]
    assert said[-1].startswith("ready: admission webhooks of ClusterQueue")


@pytest.mark.parametrize(
    "reply",
    [
        (422, {"kind": "Status", "reason": "Invalid", "message": "spec: Invalid value"}),
        (403, {"kind": "Status", "message": 'admission webhook "vcq.kb.io" denied the request'}),
    ],
)
def test_a_webhook_that_refuses_the_object_has_answered(serve, account, reply):
    api = FakeApi({("POST", f"{QUEUES}?dryRun=All"): [reply]})
    wait([ready_gate.dry_run_answered(QUEUES, PROBE)], serve(api), account)
    assert len(api.seen) == 1


@pytest.mark.parametrize(
    "reply",
    [
        (404, {"kind": "Status", "reason": "NotFound"}),  # the kind is not served yet
        (403, {"kind": "Status", "message": 'clusterqueues is forbidden: User "x" cannot'}),
    ],
)
def test_no_answer_from_admission_is_not_ready(serve, account, reply):
    api = FakeApi({("POST", f"{QUEUES}?dryRun=All"): [reply]})
    with pytest.raises(ready_gate.NotReady, match="admission webhooks of ClusterQueue"):
        wait([ready_gate.dry_run_answered(QUEUES, PROBE)], serve(api), account, deadline_s=0.1)


def test_api_server_refusing_connections_is_retried_until_the_bound(account):
    import socket

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ready_gate.NotReady, match="no answer from the API server"):
        wait([ready_gate.crd_established(CRD)], url, account, deadline_s=0.2)


def test_checks_run_in_order_within_one_deadline(serve, account):
    api = FakeApi(
        {
            ("GET", ready_gate.CRD_PATH + CRD): [crd("True")],
            ("POST", f"{QUEUES}?dryRun=All"): [(201, PROBE)],
        }
    )
    checks = [ready_gate.crd_established(CRD), ready_gate.dry_run_answered(QUEUES, PROBE)]
    wait(checks, serve(api), account)
    assert [m for m, _, _, _ in api.seen] == ["GET", "POST"]


def test_the_module_exits_1_with_the_message_and_0_when_ready(serve, account):
    never = FakeApi({("GET", ready_gate.CRD_PATH + CRD): [crd("False")]})
    run = [sys.executable, "-m", "workloads.ready_gate", "--crd", CRD, "--poll-s", "0.01"]
    where = ["--service-account-dir", account]
    failed = subprocess.run(
        [*run, "--deadline-s", "0.2", "--api", serve(never), *where],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert failed.returncode == 1
    assert f"not ready: CRD {CRD}: not ready after" in failed.stderr
    ready = FakeApi({("GET", ready_gate.CRD_PATH + CRD): [crd("True")]})
    passed = subprocess.run(
        [*run, "--deadline-s", "5", "--api", serve(ready), *where],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert passed.returncode == 0, passed.stderr
    assert "all ready after" in passed.stdout
