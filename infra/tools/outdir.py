"""The one writer of what park writes: inside the folder it was given, never through a link,
never over (or away) a file it did not write.

Rendered folders are committed, so a pull request can plant things in them that CI's `park
render --out` then meets: a symbolic link in place of `manifests/` or a manifest, a dangling
link where `resources.json` goes, a record (`.park-render.json`) that lists `../x` or an
absolute path with that file's digest. Every path here is opened relative to the folder's own
descriptor, one component at a time with O_NOFOLLOW, so no link is followed and no name climbs
out; a file is written to a new temporary name and renamed over its entry (the rename replaces
the entry itself, never what a link points at); a file is deleted only when the record lists
it, it sits strictly inside the folder under a name park writes, and it is a regular file
with the recorded digest. Anything else is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO

RECORD = ".park-render.json"  # what park wrote into --out, and each file's digest
MAX_RECORD_BYTES = 1024 * 1024  # a record of a few hundred entries is ~40 KB
# The names park writes inside a folder: a file, or a file in one sub-folder; no dot files
# (the record is park's own), no `..`, nothing absolute.
_PART = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}"
ENTRY = re.compile(rf"^(?:{_PART}/)?{_PART}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class OutputError(RuntimeError):
    """A folder park cannot write into as it must: one line, no traceback."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _why(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a regular file"


def _lstat(name: str, folder: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_child(folder: int, name: str, shown: Path, *, create: bool) -> int:
    """The folder `name` inside `folder` (created when missing and `create`): never a link."""
    found = _lstat(name, folder)
    if found is None and create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=folder)
        found = _lstat(name, folder)
    if found is None:
        raise OutputError(f"{shown}: no such folder")
    if not stat.S_ISDIR(found.st_mode):
        kind = _kind(found.st_mode)
        raise OutputError(f"{shown}: {kind}, not a folder; park writes only into a real folder")
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=folder)
    except OSError as err:  # replaced by a link since the check: refused all the same
        raise OutputError(f"{shown}: cannot open it ({_why(err)})") from None


def open_folder(path: Path, *, create: bool = True) -> int:
    """A descriptor of the folder `path`, created when missing. A relative path is walked from
    the current directory one component at a time and none may be a symbolic link (a link
    committed in a repository cannot send park elsewhere); an absolute path's parents are the
    caller's own, its last component may not be a link. The caller closes it."""
    parts = path.parts
    if path.is_absolute():
        start, parts = str(path.parent), (path.name,) if path.name else ()
    else:
        start = "."
    try:
        if create and path.is_absolute():
            Path(start).mkdir(parents=True, exist_ok=True)
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise OutputError(f"{path}: cannot create or open it ({_why(err)})") from None
    walked = Path(start if path.is_absolute() else "")
    try:
        for part in parts:
            walked = walked / part
            if part == ".":
                continue
            child = _open_child(fd, part, walked, create=create)
            os.close(fd)
            fd = child
    except OSError as err:
        os.close(fd)
        raise OutputError(f"{path}: cannot create or open it ({_why(err)})") from None
    except OutputError:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def folder(path: Path, *, create: bool = True) -> Iterator[int]:
    fd = open_folder(path, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def _split(relative: str) -> tuple[str | None, str]:
    head, _, tail = relative.rpartition("/")
    return (head or None), tail


@contextlib.contextmanager
def _parent(root: int, relative: str, shown: Path, *, create: bool) -> Iterator[int | None]:
    """The folder holding `relative` inside `root` (None: it does not exist, not created)."""
    sub, _ = _split(relative)
    if sub is None:
        yield root
        return
    if not create and _lstat(sub, root) is None:
        yield None
        return
    fd = _open_child(root, sub, shown / sub, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_regular(name: str, parent: int, shown: Path, limit: int) -> bytes:
    """A regular file's bytes, opened without following a link; at most `limit` bytes."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=parent)
    except OSError as err:
        raise OutputError(f"{shown}: cannot read it ({_why(err)})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OutputError(f"{shown}: not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OutputError(f"{shown}: larger than {limit} bytes")
    return data


def _file_digest(name: str, parent: int, shown: Path) -> str:
    """A regular file's SHA-256, streamed (a planted 10 GB file is hashed, not loaded)."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=parent)
    except OSError as err:
        raise OutputError(f"{shown}: cannot read it ({_why(err)})") from None
    sha = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OutputError(f"{shown}: not a regular file")
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def _write(name: str, parent: int, data: bytes) -> None:
    """`data` into a new file beside `name`, then renamed over it: the rename replaces the
    entry `name` (a link there is replaced, never followed)."""
    temporary = f".park-tmp-{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise


def read_record(root: int, out: Path) -> dict[str, str]:
    """The files a previous render wrote into `out` and their digests; {} when none. A record
    that lists a name park does not write (`../x`, an absolute path, a dot file) is refused."""
    found = _lstat(RECORD, root)
    if found is None:
        return {}
    shown = out / RECORD
    if not stat.S_ISREG(found.st_mode):
        raise OutputError(f"{shown}: {_kind(found.st_mode)}, not a record park wrote")
    try:
        record = json.loads(_read_regular(RECORD, root, shown, MAX_RECORD_BYTES))
    except (ValueError, UnicodeDecodeError):
        record = None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        raise OutputError(f"{shown}: not a record park wrote; remove it or pick another --out")
    for name, value in files.items():
        if not isinstance(name, str) or not ENTRY.match(name):
            raise OutputError(
                f"{shown} lists {name!r}, which is not a file park writes inside --out (a name "
                "in it, or in one folder of it; no '..', no absolute path): remove the record "
                "or pick another --out"
            )
        if not isinstance(value, str) or not _DIGEST.match(value):
            raise OutputError(f"{shown}: {name!r} has no SHA-256 digest; remove the record")
    return dict(files)


def _state(root: int, relative: str, out: Path) -> tuple[str, str | None]:
    """("absent" | "file" | what else it is, the file's digest)."""
    with _parent(root, relative, out, create=False) as parent:
        if parent is None:
            return "absent", None
        _, name = _split(relative)
        found = _lstat(name, parent)
        if found is None:
            return "absent", None
        if not stat.S_ISREG(found.st_mode):
            return _kind(found.st_mode), None
        return "file", _file_digest(name, parent, out / relative)


def _open_out(out: Path, names: Iterable[str]) -> int:
    """The folder `out` opened (created when missing) once every name is one park writes."""
    bad = sorted(name for name in names if not ENTRY.match(name))
    if bad:
        raise OutputError(f"--out {out}: {bad[0]!r} is not a name park writes (a bug)")
    try:
        return open_folder(out)
    except OutputError as err:
        raise OutputError(f"--out {err}") from None


def write_owned(out: Path, files: Mapping[str, bytes]) -> None:
    """Write `files` (relative name → bytes) into `out`, which holds only what park wrote
    there: RECORD lists each file and its digest. A file park did not write, or one changed
    since, is never overwritten or deleted (OutputError, naming it); files of an earlier
    write that this one no longer makes are deleted only when they are park's and unchanged.
    Everything is checked before the first byte is written."""
    root = _open_out(out, files)
    try:
        previous = read_record(root, out)
        foreign, links = [], []
        for name in sorted(files):
            kind, seen = _state(root, name, out)
            if kind == "file" and previous.get(name) != seen:
                foreign.append(name)
            elif kind not in ("absent", "file"):
                links.append(f"{name} ({kind})")
        stale = []
        for name in sorted(set(previous) - set(files)):
            kind, seen = _state(root, name, out)
            if kind not in ("absent", "file"):
                links.append(f"{name} ({kind}, listed in {RECORD})")
            elif kind == "file" and seen == previous[name]:
                stale.append(name)  # park's own file from an earlier write, unchanged
        if links:
            raise OutputError(
                f"--out {out}: {', '.join(links[:5])}{' ...' if len(links) > 5 else ''}: park "
                "writes and deletes only regular files, never through a link; remove it or pick "
                "another --out"
            )
        if foreign:
            raise OutputError(
                f"--out {out}: {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''} "
                "exist(s) and park did not write them (or they changed since); move them or "
                "pick another --out"
            )
        try:
            for name in stale:
                with _parent(root, name, out, create=False) as parent:
                    if parent is not None:
                        os.unlink(_split(name)[1], dir_fd=parent)
            for name, data in files.items():
                with _parent(root, name, out, create=True) as parent:
                    assert parent is not None
                    _write(_split(name)[1], parent, data)
            record = {"files": {name: digest(data) for name, data in sorted(files.items())}}
            _write(RECORD, root, (json.dumps(record, indent=2) + "\n").encode())
        except OSError as err:
            raise OutputError(f"--out {out}: cannot write ({_why(err)})") from None
    finally:
        os.close(root)


def make_folder(path: Path) -> Path:
    """`path` as a real folder (created, parents too), never a link: where `park local` keeps
    a run's logs and configs."""
    with folder(path):
        return path


def open_new(path: Path, mode: str = "w") -> IO:
    """`path` opened for writing (truncated), refusing a link in its place; its folder is
    the caller's (make_folder)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
    except OSError as err:
        raise OutputError(f"{path}: cannot write it ({_why(err)})") from None
    return os.fdopen(fd, mode)


def write_new(path: Path, text: str) -> None:
    with open_new(path) as handle:
        handle.write(text)


def write_beside(out: Path, name: str, data: bytes, *, ours: Callable[[bytes], bool]) -> None:
    """One file `name` into the folder `out` (created when missing) beside what else is there
    (a render's files and record untouched): never through a link, and over an existing file
    only when `ours` says park wrote it (`park preflight`'s report)."""
    root = _open_out(out, [name, *(["/"] if "/" in name else [])])  # no sub-folder here
    try:
        found = _lstat(name, root)
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise OutputError(f"--out {out}: {name} is {_kind(found.st_mode)}; park writes no link")
        if found is not None and not ours(_read_regular(name, root, out / name, MAX_RECORD_BYTES)):
            raise OutputError(f"--out {out}: {name} exists and park did not write it; move it")
        try:
            _write(name, root, data)
        except OSError as err:
            raise OutputError(f"--out {out}: cannot write ({_why(err)})") from None
    finally:
        os.close(root)
