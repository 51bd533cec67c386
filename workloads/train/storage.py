"""Files on local disk or in a bucket, through one interface: pyarrow's filesystems.

pyarrow comes with Ray, reads ``gs://`` (and ``file://``, ``s3://``) with the pod's credentials
(Workload Identity on GKE), and gives random access, so a worker can read just its byte range
of a large file. With ``STORAGE_EMULATOR_HOST`` set (the variable Google's own storage clients
honour), every ``gs://`` call goes to that emulator instead, anonymously over http, and no
credential or metadata server is looked for: `park local` runs the workloads against an
emulated Cloud Storage that grants only what the stack's roles grant.

Things a worker needs as local files (a model's safetensors, which are memory-mapped) are
mirrored once per node into the cache, under a lock, so that the 4-16 workers of a host
neither download the same bytes 16 times nor see a half-written file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow.fs as pafs

from workloads import local_models


def cache_dir() -> Path:
    """``$PARK_CACHE_DIR/train`` or ``~/.cache/park-gke/train`` (the serving side's root)."""
    return local_models.cache_root() / "train"


EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # Google's clients' name: http://HOST:PORT or HOST:PORT
# How long a call to the emulator is retried (transient errors only: a 403 is never retried).
EMULATOR_RETRY_S = 15.0


def emulator_endpoint() -> str | None:
    """``HOST:PORT`` of the Cloud Storage emulator named by ``STORAGE_EMULATOR_HOST``, or None."""
    value = os.environ.get(EMULATOR_ENV, "").strip()
    if not value:
        return None
    endpoint = value.split("://", 1)[-1].rstrip("/")
    if not endpoint or "/" in endpoint:
        raise ValueError(f"{EMULATOR_ENV}={value!r}: expected http://HOST:PORT or HOST:PORT")
    return endpoint


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it, for ``gs://...``, ``file://...`` or a local path.
    A ``gs://`` URI goes to the emulator when ``STORAGE_EMULATOR_HOST`` names one."""
    endpoint = emulator_endpoint() if uri.startswith("gs://") else None
    if endpoint is not None:
        import datetime

        gcs = pafs.GcsFileSystem(
            anonymous=True,
            scheme="http",
            endpoint_override=endpoint,
            retry_time_limit=datetime.timedelta(seconds=EMULATOR_RETRY_S),
        )
        return gcs, uri.removeprefix("gs://").rstrip("/")
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def ray_storage(storage_path: str) -> tuple[str, pafs.FileSystem | None]:
    """Ray Train's ``storage_path`` and ``storage_filesystem`` for a run's storage: Ray's own
    resolution of the URI, except that a ``gs://`` path goes to the emulator when one is named
    (Ray would look for cloud credentials)."""
    if storage_path.startswith("gs://") and emulator_endpoint() is not None:
        fs, path = filesystem(storage_path)
        return path, fs
    return storage_path, None


def make_parent(fs: pafs.FileSystem, path: str) -> None:
    """Create ``path``'s parent folder where the filesystem has folders. A bucket has none and
    needs none before a write: pyarrow's ``create_dir`` there reads the bucket's metadata
    (``storage.buckets.get``) when no parent marker exists, a call the write does not need."""
    if fs.type_name != "gcs":
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or a path with '/' (what buckets use on every OS)."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def list_files(uri: str, suffixes: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """``(path, size)`` of the file ``uri``, or of every file under the folder or prefix ``uri``
    (recursive, sorted; only names ending in ``suffixes`` when given)."""
    fs, root = filesystem(uri)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [(root, int(info.size or 0))]
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(uri)
    wanted = tuple(suffixes) if suffixes is not None else None
    found = [
        (i.path, int(i.size or 0))
        for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
        if i.type == pafs.FileType.File
        and not Path(i.path).name.startswith(".")
        and (wanted is None or i.path.endswith(wanted))
    ]
    return sorted(found)


@contextlib.contextmanager
def node_lock(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this machine (the workers of a host)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mirror(uri: str, keep: Callable[[str], bool] | None = None) -> Path:
    """A local copy of the remote folder ``uri`` (only the files whose name ``keep`` accepts,
    when given), made once per node; returns its path. Complete or absent, never partial: it
    is filled in a temporary sibling and renamed into place. The copy is named by the URI and
    the files it holds (names and sizes): another selection of the same folder, or the same
    URI written again by a later run, is another copy, never a stale one."""
    listed = [(p, n) for p, n in list_files(uri) if keep is None or keep(Path(p).name)]
    target = cache_dir() / "mirror" / key_of(uri.rstrip("/") + repr(listed))
    if (target / ".complete").exists():
        return target
    with node_lock(f"mirror-{target.name}"):
        if (target / ".complete").exists():
            return target
        fs, root = filesystem(uri)
        files = [path for path, _ in listed]
        with local_models.built_in_place(target) as staging:
            for path in files:
                relative = os.path.relpath(path, root) if files != [root] else Path(path).name
                local = staging / relative
                local.parent.mkdir(parents=True, exist_ok=True)
                pafs.copy_files(
                    path,
                    str(local),
                    source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem(),
                )
            (staging / ".complete").write_text(uri + "\n")
    return target


# The stack's bucket as the pods see it (infra/plan/ray/pods.py `scratch_env`): gs://BUCKET and the
# folder its GCS FUSE mount shows it at.
BUCKET_URI_ENV = "PARK_BUCKET_URI"
BUCKET_MOUNT_ENV = "PARK_BUCKET_MOUNT"


def local_path(uri: str) -> Path | None:
    """``uri`` as a folder of this machine, read and written in place: a local path or
    ``file://`` as it is, the stack's bucket through its mount when the pod has one; None
    for anything else (which would need a copy)."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri:
        return Path(os.path.abspath(os.path.expanduser(uri)))
    bucket = os.environ.get(BUCKET_URI_ENV, "").rstrip("/")
    mount = os.environ.get(BUCKET_MOUNT_ENV)
    if (
        bucket
        and mount
        and Path(mount).is_dir()
        and (uri == bucket or uri.startswith(bucket + "/"))
    ):
        return Path(mount) / uri[len(bucket) :].lstrip("/")
    return None


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file (parents are created; on a bucket there are none to create)."""
    fs, path = filesystem(uri)
    make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(data)


def upload_folder(local: Path, uri: str, *, skip: Iterable[str] = ()) -> list[str]:
    """Copy the files of the local folder ``local`` to ``uri``; return the names copied."""
    skipped = set(skip)
    names = sorted(p.name for p in local.iterdir() if p.is_file() and p.name not in skipped)
    for name in names:
        write_bytes(join(uri, name), (local / name).read_bytes())
    return names


def remove_folder(uri: str) -> None:
    """Delete the folder or prefix ``uri`` and everything under it (fine if it is absent)."""
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir_contents(path, missing_dir_ok=True)
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_dir(path)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound
