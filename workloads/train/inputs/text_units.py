"""The units a text data set is read in: byte ranges of a text file, row groups of a parquet
file, shards of a hub data set (the "Sources" part of workloads/train/inputs/text.py's story).

Each unit is read with pyarrow's filesystems on its own, so a worker reads just its own bytes
and never holds more than one unit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from workloads.train import storage
from workloads.train.config_rules import HF_DATA_PREFIX, TEXT_SUFFIXES
from workloads.train.inputs.batches import DataError

UNIT_BYTES = 64 << 20


@dataclass(frozen=True)
class Unit:
    """A piece of the data set: bytes [start, end) of a text file, row groups [start, end) of
    a parquet file, or shard ``start`` of ``end`` of a hub data set."""

    kind: str  # "lines" (.jsonl, .txt), "json" (a .json array), "parquet", "hf"
    uri: str
    start: int
    end: int
    options: tuple[str, ...] = ()  # hf: (config, split); lines: (suffix,)


def plan_units(spec: str, *, split: str = "train", unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """Every unit of ``--data spec``, in a fixed order (the same on every worker)."""
    if spec.startswith(HF_DATA_PREFIX):
        return _hub_units(spec.removeprefix(HF_DATA_PREFIX), split)
    try:
        files = storage.list_files(spec, TEXT_SUFFIXES)
    except FileNotFoundError as err:
        raise DataError(f"--data {spec}: no such file or folder") from err
    if not files:
        raise DataError(f"--data {spec}: no {', '.join(TEXT_SUFFIXES)} files in it")
    units: list[Unit] = []
    for path, size in files:
        uri = _uri(spec, path)
        if path.endswith(".parquet"):
            units += _parquet_units(uri)
        elif path.endswith(".json") and _starts_with(uri, b"["):
            units.append(Unit("json", uri, 0, size))
        else:
            suffix = ".txt" if path.endswith(".txt") else ".jsonl"
            units += [
                Unit("lines", uri, start, min(start + unit_bytes, size), (suffix,))
                for start in range(0, max(size, 1), unit_bytes)
            ]
    return units


def _uri(spec: str, path: str) -> str:
    """A listed path back as a URI of the same filesystem (pyarrow lists gs:// without it)."""
    if "://" in spec and "://" not in path:
        return f"{spec.split('://', 1)[0]}://{path}"
    return path


def _starts_with(uri: str, prefix: bytes) -> bool:
    fs, path = storage.filesystem(uri)
    with fs.open_input_file(path) as handle:
        head = handle.read(4096).lstrip()
    return head.startswith(prefix)


def _parquet_units(uri: str) -> list[Unit]:
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(uri)
    with fs.open_input_file(path) as handle:
        groups = pq.ParquetFile(handle).metadata.num_row_groups
    return [Unit("parquet", uri, g, g + 1) for g in range(groups)]


def _hub_dataset(name: str, split: str) -> Any:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"--data {HF_DATA_PREFIX}{name}: reading a hub data set needs the `datasets` "
            "package (pip install datasets); or give jsonl/parquet files"
        ) from err
    repo, _, config = name.partition(":")
    try:
        return datasets.load_dataset(repo, config or None, split=split, streaming=True)
    except Exception as err:  # datasets raises many kinds; say which flag to look at
        raise DataError(
            f"--data {HF_DATA_PREFIX}{name} --data-split {split}: could not open it ({err})"
        ) from err


def _hub_units(name: str, split: str) -> list[Unit]:
    dataset = _hub_dataset(name, split)
    shards = getattr(dataset, "num_shards", None) or getattr(dataset, "n_shards", None) or 1
    shards = int(shards)
    return [Unit("hf", name, i, shards, ("", split)) for i in range(shards)]


def read_unit(unit: Unit) -> Iterator[Any]:
    """The unit's raw items in file order: lines (bytes), or records (dicts)."""
    if unit.kind == "hf":
        dataset = _hub_dataset(unit.uri, unit.options[1])
        yield from dataset.shard(num_shards=unit.end, index=unit.start)
        return
    fs, path = storage.filesystem(unit.uri)
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        with fs.open_input_file(path) as handle:
            table = pq.ParquetFile(handle).read_row_groups(list(range(unit.start, unit.end)))
        yield from table.to_pylist()
        return
    with fs.open_input_file(path) as handle:
        if unit.kind == "json":
            records = json.loads(handle.read())
            if not isinstance(records, list):
                raise DataError(f"{unit.uri}: a .json file must hold JSON Lines or one array")
            yield from records
            return
        yield from _lines(handle, unit.start, unit.end)


def _lines(handle: Any, start: int, end: int) -> Iterator[bytes]:
    """The lines whose first byte lies in [start, end) (the unit that holds a line's start
    owns it, so byte ranges split a file into whole lines, each read once)."""
    begin = max(start - 1, 0)
    handle.seek(begin)
    data = handle.read(end - begin)
    while data and not data.endswith(b"\n"):
        more = handle.read(1 << 16)
        if not more:
            break
        cut = more.find(b"\n")
        data += more if cut < 0 else more[: cut + 1]
        if cut >= 0:
            break
    if start > 0:
        first = data.find(b"\n")  # data[0] is byte start-1: a line starts at start iff it is \n
        data = data[first + 1 :] if first >= 0 else b""
    for line in data.splitlines():
        if line.strip():
            yield line


def parse_item(unit: Unit, item: Any) -> Any:
    """A raw item as a record: a dict, or a str for a .txt line."""
    if unit.kind != "lines":
        return item
    text = item.decode("utf-8", errors="replace")
    if unit.options and unit.options[0] == ".txt":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{unit.uri}: a line is not JSON ({err.msg}): {text[:80]!r}") from err
