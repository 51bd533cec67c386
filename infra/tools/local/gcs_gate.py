"""A gate in front of an emulated Cloud Storage that answers as IAM does: each JSON API call is
allowed only when the stack's bucket roles grant every permission it needs, and gets Cloud
Storage's own 403 otherwise. Every call is recorded with its permissions, per workload.

The emulator (fake-gcs-server, infra/tools/local/bucket.py) grants everything; the cloud does
not. Which permission a call needs follows Cloud Storage's JSON API reference (each method's
"Authorization scopes / IAM permissions" section): a bucket's metadata needs
`storage.buckets.get`, a listing `storage.objects.list`, a read `storage.objects.get`, an
upload `storage.objects.create` and, when it replaces an existing object,
`storage.objects.delete` too. A call the table does not know is refused (fail closed), so a
new kind of call cannot slip through unrecorded.

Each workload reaches the gate on a port of its own (its ``STORAGE_EMULATOR_HOST``), so the
record says who made each call. Loopback only.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

# Bodies larger than this are refused (a local run's largest object is a few MB).
MAX_BODY = 512 * 1024**2
_OBJECT = r"(?P<bucket>[^/]+)/o/(?P<object>[^/]+)"


@dataclass(frozen=True)
class Call:
    """One JSON API request as IAM sees it."""

    method: str
    kind: str  # what it does, in the JSON API's words (objects.insert, buckets.get, ...)
    bucket: str | None
    object: str | None
    permissions: tuple[str, ...]


@dataclass(frozen=True)
class Record:
    """One call as the gate saw it: who, what, which permissions, which were missing."""

    workload: str
    method: str
    kind: str
    object: str | None
    permissions: tuple[str, ...]
    denied: tuple[str, ...]


# (method, path pattern, kind, permissions). Upload initiations are resolved in `classify`.
_ROUTES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("GET", r"/storage/v1/b/(?P<bucket>[^/]+)", "buckets.get", ("storage.buckets.get",)),
    ("GET", r"/storage/v1/b/(?P<bucket>[^/]+)/o", "objects.list", ("storage.objects.list",)),
    ("GET", r"/storage/v1/b/" + _OBJECT, "objects.get", ("storage.objects.get",)),
    ("GET", r"/download/storage/v1/b/" + _OBJECT, "objects.get", ("storage.objects.get",)),
    ("DELETE", r"/storage/v1/b/" + _OBJECT, "objects.delete", ("storage.objects.delete",)),
    ("PATCH", r"/storage/v1/b/" + _OBJECT, "objects.patch", ("storage.objects.update",)),
    ("PUT", r"/storage/v1/b/" + _OBJECT, "objects.update", ("storage.objects.update",)),
    ("POST", r"/upload/storage/v1/b/(?P<bucket>[^/]+)/o", "objects.insert", ()),
    ("POST", r"/storage/v1/b/(?P<bucket>[^/]+)/o", "objects.insert", ()),
    (
        "POST",
        r"/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>[^/]+)/compose",
        "objects.compose",
        ("storage.objects.get",),
    ),
    (
        "GET",
        r"/storage/v1/b/(?P<bucket>[^/]+)/iam",
        "buckets.getIamPolicy",
        ("storage.buckets.getIamPolicy",),
    ),
    ("GET", r"/storage/v1/b", "buckets.list", ("storage.buckets.list",)),
    ("POST", r"/storage/v1/b", "buckets.insert", ("storage.buckets.create",)),
    ("DELETE", r"/storage/v1/b/(?P<bucket>[^/]+)", "buckets.delete", ("storage.buckets.delete",)),
)


def _upload_name(query: dict[str, list[str]], body: bytes) -> str | None:
    """The object an upload writes: the `name` query parameter, or the JSON metadata's name
    (a resumable start's body, or the first part of a multipart upload)."""
    if query.get("name"):
        return query["name"][0]
    match = re.search(rb"\{.*?\}", body, re.S)
    if match:
        try:
            name = json.loads(match.group(0)).get("name")
        except (ValueError, AttributeError):
            return None
        return str(name) if name else None
    return None


def classify(
    method: str, target: str, body: bytes, exists: Callable[[str, str], bool]
) -> Call | None:
    """The call a request makes, or None when it is not one the table knows. `exists(bucket,
    object)` says whether an upload would replace an object (then it needs delete too)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    path = parts.path.rstrip("/") or "/"
    for route_method, pattern, kind, permissions in _ROUTES:
        match = re.fullmatch(pattern, path)
        if route_method != method or match is None:
            continue
        groups = match.groupdict()
        bucket = groups.get("bucket")
        obj = unquote(groups["object"]) if groups.get("object") else None
        if kind == "objects.insert":
            obj = _upload_name(query, body)
            needed = ["storage.objects.create"]
            overwrite_ok = query.get("ifGenerationMatch") == ["0"]
            if bucket and obj and not overwrite_ok and exists(bucket, obj):
                needed.append("storage.objects.delete")
            permissions = tuple(needed)
        if kind == "objects.compose":
            permissions = ("storage.objects.create", *permissions)
        return Call(method, kind, bucket, obj, permissions)
    return None


def _denial(principal: str, call: Call, missing: tuple[str, ...]) -> bytes:
    """Cloud Storage's 403 body, with its wording."""
    what = "bucket" if call.object is None else "object"
    message = (
        f"{principal} does not have {missing[0]} access to the Google Cloud Storage {what}. "
        f"Permission '{missing[0]}' denied on resource (or it may not exist)."
    )
    error = {"code": 403, "message": message}
    body = {"error": {**error, "errors": [{**error, "domain": "global", "reason": "forbidden"}]}}
    return json.dumps(body).encode()


class GateLog:
    """The calls every listener of one gate saw (thread-safe), appended to a JSONL file."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def add(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)
            if self.path is not None:
                with open(self.path, "a") as out:
                    out.write(json.dumps(asdict(record)) + "\n")

    def denied(self) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.denied]

    def permissions(self, workload: str) -> set[str]:
        """Every permission `workload`'s allowed calls used."""
        with self._lock:
            return {p for r in self.records if r.workload == workload for p in r.permissions}


@dataclass(frozen=True)
class GatePolicy:
    """What the gate enforces: one bucket, the permissions granted on it, and who asks."""

    bucket: str
    granted: frozenset[str]
    principal: str  # the workload identity, as Cloud Storage names it in a 403


class _Handler(BaseHTTPRequestHandler):
    server: _GateServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the log is the record
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                total += size
                if total > MAX_BODY:
                    raise ValueError("request body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        gate = self.server
        body = self._body()
        upload = parse_qs(urlsplit(self.path).query).get("upload_id")
        if upload and urlsplit(self.path).path.startswith("/upload/"):
            # A resumable upload's later requests: its start was judged (and recorded).
            if upload[0] not in gate.uploads:
                self._reply(404, b'{"error": {"code": 404, "message": "no such upload"}}', [])
                return
            self._forward(body)
            return
        call = classify(self.command, self.path, body, gate.exists)
        if call is None:
            permissions: tuple[str, ...] = ()
            denied: tuple[str, ...] = (f"unknown call {self.command} {urlsplit(self.path).path}",)
            kind = "unknown"
        else:
            permissions, kind = call.permissions, call.kind
            if call.bucket != gate.policy.bucket:  # nothing is granted beyond the bucket
                denied = permissions
            else:
                denied = tuple(p for p in permissions if p not in gate.policy.granted)
        gate.log.add(
            Record(
                gate.workload,
                self.command,
                kind,
                call.object if call else None,
                permissions,
                denied,
            )
        )
        if denied:
            principal = gate.policy.principal
            fake = call or Call(self.command, kind, None, None, denied)
            self._reply(
                403, _denial(principal, fake, denied), [("Content-Type", "application/json")]
            )
            return
        self._forward(body)

    def _forward(self, body: bytes) -> None:
        gate = self.server
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("host", "transfer-encoding", "connection", "content-length")
        }
        connection = http.client.HTTPConnection(gate.upstream_host, gate.upstream_port, timeout=60)
        try:
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            out: list[tuple[str, str]] = []
            for name, value in response.getheaders():
                if name.lower() in ("transfer-encoding", "connection", "content-length"):
                    continue
                if name.lower() == "location":
                    value = value.replace(gate.upstream_url, gate.url)
                    found = parse_qs(urlsplit(value).query).get("upload_id")
                    if found:
                        gate.uploads.add(found[0])
                out.append((name, value))
            self._reply(response.status, data, out)
        finally:
            connection.close()

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET


class _GateServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, workload: str, policy: GatePolicy, upstream_url: str, log: GateLog) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.workload = workload
        self.policy = policy
        self.log = log
        self.upstream_url = upstream_url.rstrip("/")
        host_port = self.upstream_url.split("://", 1)[-1]
        self.upstream_host, port = host_port.rsplit(":", 1)
        self.upstream_port = int(port)
        self.uploads: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def exists(self, bucket: str, obj: str) -> bool:
        """Whether the emulator holds the object (asked directly: not a workload's call)."""
        connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=30)
        try:
            connection.request("GET", f"/storage/v1/b/{bucket}/o/{quote(obj, safe='')}")
            response = connection.getresponse()
            response.read()
            return response.status == 200
        finally:
            connection.close()


class Gate:
    """One listener per workload in front of the emulator at `upstream_url`."""

    def __init__(self, policy: GatePolicy, upstream_url: str, log: GateLog) -> None:
        self.policy = policy
        self.upstream_url = upstream_url
        self.log = log
        self._servers: dict[str, _GateServer] = {}

    def endpoint(self, workload: str) -> str:
        """`workload`'s STORAGE_EMULATOR_HOST (a listener of its own, started on first use)."""
        if workload not in self._servers:
            server = _GateServer(workload, self.policy, self.upstream_url, self.log)
            threading.Thread(
                target=server.serve_forever, name=f"gcs-gate-{workload}", daemon=True
            ).start()
            self._servers[workload] = server
        return self._servers[workload].url

    def close(self) -> None:
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        self._servers.clear()
