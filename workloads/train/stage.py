"""Stage a Hugging Face hub model into the stack's bucket, once, before the workloads run.

    python -m workloads.train.stage --repo Qwen/Qwen3-8B --dest gs://BUCKET/models/Qwen/Qwen3-8B

Training and serving then read the model through the bucket's FUSE mount (serving with a sized
gcsfuse file cache) instead of every host downloading it from the hub into its scratch disk
(infra/resolve/disk.py). Each file streams from the hub straight into the bucket through pyarrow's
output stream: nothing is written to the pod's disk, so the Job that runs this needs only a
small scratch. A marker written last names the hub revision: a rerun of a complete copy of
the same revision does nothing, and a half-done copy (no marker) is redone. The token is read
as the hub client reads it (HF_TOKEN, or the file at HF_TOKEN_PATH).

Torch-free: it runs in any of the workload images.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO, Any

from workloads import protocol
from workloads.train import storage

# What neither the trainer nor the engine reads (workloads/train/hf.py HUB_IGNORE, and the
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
    Skips the copy when `dest` already holds this revision complete."""
    marker_uri = storage.join(dest, MARKER)
    if storage.exists(marker_uri):
        fs, path = storage.filesystem(marker_uri)
        with fs.open_input_stream(path) as stream:
            found = json.loads(stream.read())
        if found.get("revision") == listing.revision:
            print(f"{repo}@{listing.revision}: already staged at {dest}")
            return dict(found)
        storage.remove_folder(dest)  # another revision: start clean
    copied: list[str] = []
    total = 0
    for name, size in listing.files:
        if not wanted(name):
            continue
        fs, path = storage.filesystem(storage.join(dest, name))
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with open_file(name) as source, fs.open_output_stream(path) as out:
            shutil.copyfileobj(source, out, CHUNK)
        copied.append(name)
        total += size
        print(f"{repo}: {name} ({size / 2**20:.0f} MiB)", flush=True)
    marker = {"repo": repo, "revision": listing.revision, "files": copied, "bytes": total}
    storage.write_bytes(marker_uri, json.dumps(marker, indent=2).encode())
    print(f"{repo}@{listing.revision}: {len(copied)} files, {total / 2**30:.1f} GiB at {dest}")
    return marker


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
    args = parser.parse_args(argv)
    if args.from_folder:
        listing = folder_listing(args.from_folder)
        stage(args.repo, args.dest, listing, folder_opener(args.from_folder))
        return 0
    listing = hub_listing(args.repo, args.revision)
    stage(args.repo, args.dest, listing, hub_opener(args.repo, listing.revision))
    return 0


if __name__ == "__main__":
    sys.exit(main())
