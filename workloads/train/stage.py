"""Stage a Hugging Face hub model into the stack's bucket, once, before the workloads run.

    python -m workloads.train.stage --repo Qwen/Qwen3-8B --dest gs://BUCKET/models/Qwen/Qwen3-8B

Training and serving then read the model through the bucket's FUSE mount (serving with a sized
gcsfuse file cache) instead of every host downloading it from the hub into its scratch disk
(infra/resolve/disk.py). Each file streams from the hub straight into the bucket through pyarrow's
output stream: nothing is written to the pod's disk, so the Job that runs this needs only a
small scratch. A marker written last names the hub revision: a rerun of a complete copy of
the same revision does nothing, and a half-done copy (no marker) resumes: a file already in
the bucket with the listed size is not copied again, so a Job replaced by the next `up`, or a
pod retried by the Job, goes on where the last one stopped. The token is read as the hub
client reads it (HF_TOKEN, or the file at HF_TOKEN_PATH).

A new IAM binding takes 2 to 7 minutes to reach Cloud Storage, and the Job may start inside
that window (`up` creates the binding just before): a 401 or 403 is retried until
``--iam-wait-s`` has passed, then the run fails naming what was refused.

Torch-free: it runs in any of the workload images.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Any

from workloads import protocol
from workloads.train import storage

# What neither the trainer nor the engine reads (workloads/train/models/hf.py HUB_IGNORE, and the
# hub's own dot files).
IGNORE = ("*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.onnx", "original/*", "consolidated*")
MARKER = protocol.STAGED_MARKER  # written last: the folder is complete
CHUNK = 16 * 1024 * 1024


def wanted(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and not any(fnmatch.fnmatch(name, p) for p in IGNORE)


@dataclass(frozen=True)
class Listing:
    """A hub revision: its commit and files (path, size)."""

    revision: str
    files: tuple[tuple[str, int], ...]


Opener = Callable[[str], AbstractContextManager[IO[bytes]]]


def stage(repo: str, dest: str, listing: Listing, open_file: Opener) -> dict[str, Any]:
    """Copy `listing`'s wanted files to `dest` (a gs:// or local folder); returns the marker.
    Skips the copy when `dest` already holds this revision complete, and each file already
    there with its listed size (a copy cut short resumes)."""
    marker_uri = storage.join(dest, MARKER)
    if storage.exists(marker_uri):
        fs, path = storage.filesystem(marker_uri)
        with fs.open_input_stream(path) as stream:
            found = json.loads(stream.read())
        if found.get("revision") == listing.revision:
            print(f"{repo}@{listing.revision}: already staged at {dest}")
            return dict(found)
        storage.remove_folder(dest)  # another revision: start clean
    present = _present(dest)
    copied: list[str] = []
    total = 0
    for name, size in listing.files:
        if not wanted(name):
            continue
        copied.append(name)
        total += size
        if present.get(name) == size:
            print(f"{repo}: {name} already there ({size / 2**20:.0f} MiB)", flush=True)
            continue
        fs, path = storage.filesystem(storage.join(dest, name))
        storage.make_parent(fs, path)
        with open_file(name) as source, fs.open_output_stream(path) as out:
            shutil.copyfileobj(source, out, CHUNK)
        print(f"{repo}: {name} ({size / 2**20:.0f} MiB)", flush=True)
    marker = {"repo": repo, "revision": listing.revision, "files": copied, "bytes": total}
    storage.write_bytes(marker_uri, json.dumps(marker, indent=2).encode())
    print(f"{repo}@{listing.revision}: {len(copied)} files, {total / 2**30:.1f} GiB at {dest}")
    return marker


def _present(dest: str) -> dict[str, int]:
    """The files already under `dest` (name relative to it -> size); none when it is absent."""
    try:
        found = storage.list_files(dest)
    except FileNotFoundError:
        return {}
    _, root = storage.filesystem(dest)
    return {path[len(root) :].lstrip("/"): size for path, size in found}


# How long a refused call (401/403) is retried: a new IAM binding reaches Cloud Storage within
# 2 to 7 minutes (Google's IAM docs: "Access change propagation").
IAM_WAIT_S = 420.0
IAM_RETRY_S = 15.0


def refused(err: OSError) -> bool:
    """Whether pyarrow's error is Cloud Storage refusing the caller (401 or 403)."""
    text = str(err)
    return isinstance(err, PermissionError) or any(
        word in text for word in ("PERMISSION_DENIED", "UNAUTHENTICATED", "403", "401")
    )


def stage_retrying(
    repo: str,
    dest: str,
    listing: Listing,
    open_file: Opener,
    *,
    iam_wait_s: float = IAM_WAIT_S,
    retry_s: float = IAM_RETRY_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """`stage`, retried while Cloud Storage refuses the caller, for at most `iam_wait_s` (the
    binding may still be propagating); each retry resumes. Raises PermissionError after."""
    deadline = clock() + iam_wait_s
    while True:
        try:
            return stage(repo, dest, listing, open_file)
        except OSError as err:
            if not refused(err):
                raise
            if clock() + retry_s > deadline:
                raise PermissionError(
                    f"Cloud Storage still refuses the workload identity after {iam_wait_s:.0f}s "
                    f"(an IAM binding propagates in 2-7 min; check the bucket's roles with "
                    f"`park validate`): {err}"
                ) from None
            print(f"refused, retrying in {retry_s:.0f}s (IAM may be propagating): {err}")
            sleep(retry_s)


def hub_listing(repo: str, revision: str | None = None) -> Listing:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = tuple((s.rfilename, int(s.size or 0)) for s in info.siblings or [])
    return Listing(str(info.sha), files)


def hub_opener(repo: str, revision: str) -> Opener:
    """Files of a hub revision as streams, read from the hub's resolve endpoint (it redirects
    to the CDN or the Xet bridge), never written locally."""
    from contextlib import contextmanager

    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    class _Stream:
        def __init__(self, chunks: Iterator[bytes]) -> None:
            self._chunks, self._rest = chunks, b""

        def read(self, size: int = -1) -> bytes:
            while size < 0 or len(self._rest) < size:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._rest += chunk
            out = self._rest if size < 0 else self._rest[:size]
            self._rest = b"" if size < 0 else self._rest[size:]
            return out

    @contextmanager
    def open_file(name: str) -> Iterator[Any]:
        url = hf_hub_url(repo, name, revision=revision)
        with get_session().stream(
            "GET", url, headers=build_hf_headers(), follow_redirects=True
        ) as response:
            response.raise_for_status()
            yield _Stream(response.iter_bytes(CHUNK))

    return open_file


def folder_listing(folder: str) -> Listing:
    """A local folder standing in for the hub (`park local`): its files, and a revision named
    by their names and sizes."""
    root = os.path.abspath(folder)
    files = tuple(
        sorted(
            (
                os.path.relpath(os.path.join(top, name), root),
                os.path.getsize(os.path.join(top, name)),
            )
            for top, _, names in os.walk(root)
            for name in names
        )
    )
    return Listing("local-" + storage.key_of(json.dumps(files)), files)


def folder_opener(folder: str) -> Opener:
    return lambda name: open(os.path.join(folder, name), "rb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.train.stage", description=__doc__)
    parser.add_argument("--repo", required=True, help="hub id, org/name")
    parser.add_argument("--dest", required=True, help="gs://BUCKET/models/ORG/NAME")
    parser.add_argument("--revision", default=None, help="branch, tag or commit (default main)")
    parser.add_argument(
        "--from-folder", default=None, help="a local folder instead of the hub (park local)"
    )
    parser.add_argument(
        "--iam-wait-s",
        type=float,
        default=IAM_WAIT_S,
        help="how long a refused call (401/403) is retried while IAM propagates",
    )
    args = parser.parse_args(argv)
    if args.from_folder:
        listing = folder_listing(args.from_folder)
        opener = folder_opener(args.from_folder)
    else:
        listing = hub_listing(args.repo, args.revision)
        opener = hub_opener(args.repo, listing.revision)
    try:
        stage_retrying(args.repo, args.dest, listing, opener, iam_wait_s=args.iam_wait_s)
    except PermissionError as err:
        print(f"staging {args.repo} into {args.dest} failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
