"""Where a model's facts are read: a local folder, a `gs://` path, the Hugging Face hub, the
catalogue — each remote read bounded in time, so no check hangs on the network.

Sources, in order: a model folder's `config.json` (+ its safetensors index or header for the
size) — a local path, or a `gs://` path (the stack's bucket included) read with pyarrow and the
environment's Google credentials; the Hugging Face hub when the machine is online (token from
HF_TOKEN / HF_TOKEN_PATH, files cached by huggingface_hub); then the committed catalogue
(infra.model_facts). Unknown offline is a `FactsLookup` with a reason, which the rules turn into
a warning naming how to supply the facts.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from infra.model_facts import (
    BUILTIN_PREFIX,
    FactsError,
    FactsLookup,
    ModelFacts,
    builtin,
    from_catalogue,
    from_reader,
    is_hub_id,
)


def from_folder(path: Path) -> ModelFacts:
    """Facts of a local model folder (its config.json and safetensors)."""
    if not path.is_dir():
        raise FactsError(f"{path}: no such model folder")

    def read(name: str, limit: int | None = None) -> bytes | None:
        file = path / name
        if not file.is_file():
            return None
        with file.open("rb") as handle:
            return handle.read(limit) if limit else handle.read()

    return from_reader(read, str(path))


# A remote lookup (gs://...) answers within this, or the check goes on without it: pyarrow's
# GCS client retries for ~15 minutes by default (credentials, metadata server, backoff).
REMOTE_TIMEOUT_S = float(os.environ.get("PARK_REMOTE_TIMEOUT_S", "20"))
_GS_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")


def from_uri(uri: str) -> ModelFacts:
    """Facts of a model folder behind a pyarrow filesystem URI (gs://..., file://...); a
    remote one is read within REMOTE_TIMEOUT_S, and not at all offline (PARK_OFFLINE)."""
    scheme, _, rest = uri.partition("://")
    if scheme == "gs":
        bucket = rest.split("/", 1)[0]
        if not _GS_BUCKET.match(bucket):
            raise FactsError(f"{uri[:200]!r}: not a bucket path; write gs://BUCKET/PATH")
    if scheme == "file":
        return _from_uri(uri)
    if _offline():
        raise FactsError(f"{uri}: not read offline (PARK_OFFLINE / HF_HUB_OFFLINE)")
    return within_deadline(lambda: _from_uri(uri), uri)


def within_deadline(work: Callable[[], ModelFacts], source: str) -> ModelFacts:
    """`work()` (a remote lookup) within REMOTE_TIMEOUT_S, or a FactsError saying so: the
    lookup goes on in a daemon thread nobody waits for, so no check hangs on the network."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["facts"] = work()
        except Exception as err:  # FactsError, or the client's own: said in one line below
            outcome["error"] = err

    worker = threading.Thread(target=run, name=f"facts {source}", daemon=True)
    worker.start()
    worker.join(REMOTE_TIMEOUT_S)
    if worker.is_alive():
        raise FactsError(
            f"{source}: no answer in {REMOTE_TIMEOUT_S:.0f} s (network, or credentials?); set "
            "PARK_REMOTE_TIMEOUT_S, or PARK_OFFLINE=1 to skip it"
        )
    error = outcome.get("error")
    if isinstance(error, FactsError):
        raise error
    if error is not None:
        raise FactsError(f"{source}: cannot read ({type(error).__name__})")
    facts: ModelFacts = outcome["facts"]
    return facts


def _from_uri(uri: str) -> ModelFacts:
    try:
        import pyarrow.fs as pafs
    except ImportError as err:  # infra-only install: no pyarrow
        raise FactsError(f"{uri}: reading it needs pyarrow (pip install pyarrow)") from err
    try:
        if uri.startswith("gs://"):
            from datetime import timedelta

            limit = timedelta(seconds=REMOTE_TIMEOUT_S)
            fs: Any = pafs.GcsFileSystem(retry_time_limit=limit)
            root = uri.removeprefix("gs://").rstrip("/")
        else:
            fs, root = pafs.FileSystem.from_uri(uri.rstrip("/"))
    except Exception as err:
        raise FactsError(f"{uri}: cannot open ({type(err).__name__}: {err})") from None

    def read(name: str, limit: int | None = None) -> bytes | None:
        try:
            with fs.open_input_stream(f"{root}/{name}") as stream:
                return bytes(stream.read(limit) if limit else stream.read())
        except FileNotFoundError:
            return None
        except OSError as err:
            if "not found" in str(err).lower() or "no such" in str(err).lower():
                return None
            raise FactsError(f"{uri}: cannot read {name} ({err})") from None

    return from_reader(read, uri)


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "PARK_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


@cache
def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here (its host does not resolve), asked once per
    process: huggingface_hub would retry every file with backoff (~25 s) before giving up."""
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError as err:
        return f"{host} does not resolve ({type(err).__name__}); offline?"
    return None


def from_hub(repo: str) -> ModelFacts:
    """Facts from the Hugging Face hub (config.json, and the safetensors index for the size)."""
    if _offline():
        raise FactsError(f"{repo}: the hub is off (HF_HUB_OFFLINE / PARK_OFFLINE)")
    unreachable = _hub_unreachable()
    if unreachable:
        raise FactsError(f"{repo}: the hub cannot be reached: {unreachable}")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError as err:
        raise FactsError(f"{repo}: huggingface_hub is not installed") from err
    token = os.environ.get("HF_TOKEN")
    if not token and os.environ.get("HF_TOKEN_PATH"):
        token_file = Path(os.environ["HF_TOKEN_PATH"])
        token = token_file.read_text().strip() if token_file.is_file() else None

    def read(name: str, limit: int | None = None) -> bytes | None:
        if name == "model.safetensors":
            return None  # no multi-GB download for a size: the index or the catalogue says it
        try:
            path = hf_hub_download(repo, name, token=token, etag_timeout=5)
        except EntryNotFoundError:
            return None
        except Exception as err:  # offline, 401 (gated), 404: say which
            raise FactsError(f"{repo}: the hub did not answer ({type(err).__name__})") from None
        return Path(path).read_bytes()

    return from_reader(read, f"https://huggingface.co/{repo}")


def lookup(source: str, *, mounted: str | None = None) -> FactsLookup:
    """Facts for a served model's source (HF id, gs://..., a local folder); see _lookup.

    Remote answers are kept for the process (a stack names a model several times); a folder on
    this machine is read each time (it may be an export being written)."""
    local = source.startswith(("/", ".", "~")) or (mounted and Path(mounted).is_dir())
    return _lookup(source, mounted=mounted) if local else _remembered(source, mounted)


@cache
def _remembered(source: str, mounted: str | None) -> FactsLookup:
    return _lookup(source, mounted=mounted)


def _lookup(source: str, *, mounted: str | None = None) -> FactsLookup:
    """Facts for a served model's source (HF id, gs://..., a local folder).

    `mounted`: the same model as a local path (the stack's bucket as the pods see it), tried
    when it exists on this machine."""
    tried: list[str] = []
    notes: list[str] = []
    if source.startswith(BUILTIN_PREFIX):
        return builtin(source)
    if source.startswith(("/", ".", "~")) or (mounted and Path(mounted).is_dir()):
        path = Path(mounted if mounted and Path(mounted).is_dir() else source).expanduser()
        tried.append(f"folder {path}")
        if path.is_dir():
            try:
                return FactsLookup(from_folder(path), tuple(tried))
            except FactsError as err:
                return FactsLookup(None, tuple(tried), str(err), error=str(err))
    if "://" in source:
        tried.append(source)
        try:
            return FactsLookup(from_uri(source), tuple(tried))
        except FactsError as err:
            notes.append(str(err))
    if is_hub_id(source):
        tried.append("the Hugging Face hub")
        try:
            facts = within_deadline(lambda: from_hub(source), source)
            listed = from_catalogue(source)
            if listed is not None:  # the hub's config, the catalogue's size and gating
                facts = replace(
                    facts,
                    params=listed.params if facts.params_estimated else facts.params,
                    params_estimated=facts.params_estimated and listed.params is None,
                    gated=listed.gated,
                    active_params=listed.active_params,
                )
            return FactsLookup(facts, tuple(tried), notes=tuple(notes))
        except FactsError as err:
            notes.append(str(err))
        tried.append("the catalogue")
        listed = from_catalogue(source)
        if listed is not None:
            return FactsLookup(listed, tuple(tried), notes=tuple(notes))
    if source.startswith("/") and not notes:
        notes.append(f"{source}: a path inside the Ray pods, not on this machine")
    reason = "; ".join(notes) or "not a model id, folder or URI the lookup knows"
    return FactsLookup(None, tuple(tried), reason, tuple(notes))
