"""Text and chat data for Hugging Face models: read in pieces, tokenized, packed, resumable.

**Sources.** ``--data`` names a file, a folder or a ``gs://`` prefix of ``.jsonl`` / ``.json``
(JSON Lines, or one JSON array) / ``.parquet`` / ``.txt`` (a record per line) files, an
``hf:NAME[:CONFIG]`` data set (streamed by ``datasets``), or ``park:facts``. Files are cut into
*units* (64 MiB byte ranges of a text file, row groups of a parquet file, shards of a hub data
set), read with pyarrow's filesystems, so a worker reads just its own bytes and never holds
more than one unit: a data set larger than a host's memory streams.

**Order.** Each epoch shuffles the units with (seed, epoch) and the records inside a unit with
(seed, epoch, unit); with at least as many units as workers each worker takes every
``world``-th unit, otherwise every worker reads every unit and keeps every ``world``-th
record. The stream is a pure function of (seed, rank, world size), and its position is four
numbers (epoch, unit, record, tokens of that record already used), which the checkpoint keeps
per rank: a resumed run continues with the next token it would have seen.

**Objectives.** ``clm``: each record's text (``--text-field``), BOS + tokens + EOS, packed into
rows of ``--seq-len``; a long document continues in the next row. ``sft``: each record's chat
(``--messages-field``, or ``--prompt-field`` / ``--response-field`` made into a user and an
assistant turn) rendered with the tokenizer's chat template; only the assistant turns' tokens
are targets, every other label is -100. Examples are packed whole (a row is padded rather than
split an example from its prompt). In every row, position ids restart at each document, which
transformers turns into a block-diagonal causal mask (no attention across documents), and the
last token of a document predicts nothing.

No DataLoader worker processes: batches are made on the training thread. Forking after the TPU
runtime and Ray's gRPC threads start can deadlock (Google's TorchTPU fine-tuning sample keeps
``num_workers=0`` for that reason), and tokenizing a batch costs little next to a step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workloads.train import storage
from workloads.train.config import HF_DATA_PREFIX, TEXT_SUFFIXES
from workloads.train.data import IGNORE, Batch, DataError

UNIT_BYTES = 64 << 20
STREAM_WINDOW = 4096  # records shuffled together when a unit cannot be read whole (hub shards)
STATE_VERSION = 1


# ---- units: the pieces a data set is read in -------------------------------------------------


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


# ---- records to token documents ---------------------------------------------------------------


@dataclass
class Document:
    """Token ids and which of them are targets (``mask[i]``: train on predicting ``ids[i]``)."""

    ids: np.ndarray
    mask: np.ndarray


class Encoder:
    """Turns records into Documents with the model's tokenizer, for one objective."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        objective: str,
        text_field: str = "text",
        messages_field: str = "messages",
        prompt_field: str = "prompt",
        response_field: str = "completion",
    ) -> None:
        self.tokenizer = tokenizer
        self.objective = objective
        self.text_field = text_field
        self.messages_field = messages_field
        self.prompt_fields = [f.strip() for f in prompt_field.split(",") if f.strip()]
        self.response_field = response_field
        self.bos = tokenizer.bos_token_id
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise DataError("--tokenizer has no EOS token: documents could not be separated")
        if objective == "sft" and not getattr(tokenizer, "chat_template", None):
            raise DataError(
                "--objective sft needs a tokenizer with a chat template (--tokenizer or --model)"
            )

    def encode(self, record: Any) -> Document | None:
        """The record's document, or None when it has nothing to train on."""
        if self.objective == "sft":
            return self._encode_chat(self.messages(record))
        return self._encode_text(record)

    # clm

    def _encode_text(self, record: Any) -> Document | None:
        if isinstance(record, str):
            text = record
        elif isinstance(record, dict) and isinstance(record.get(self.text_field), str):
            text = record[self.text_field]
        elif isinstance(record, dict) and self.messages_field in record:
            text = self._render(self.messages(record), generation_prompt=False)
            ids = self._tokens(text)
            return self._document([*ids, self.eos], np.ones(len(ids) + 1, dtype=bool))
        else:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"--text-field {self.text_field!r}: not in the record (it has {keys})")
        ids = [*([self.bos] if self.bos is not None else []), *self._tokens(text), self.eos]
        return self._document(ids, np.ones(len(ids), dtype=bool))

    # sft

    def messages(self, record: Any) -> list[dict[str, str]]:
        """The record's chat: its messages field, or a user and an assistant turn."""
        if not isinstance(record, dict):
            raise DataError(
                "--objective sft needs records with a chat or prompt/response fields, got text"
            )
        if self.messages_field in record:
            messages = record[self.messages_field]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages
            ):
                raise DataError(
                    f"--messages-field {self.messages_field!r}: expected a list of "
                    "{role, content}"
                )
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        missing = [f for f in [*self.prompt_fields, self.response_field] if f not in record]
        if missing:
            raise DataError(
                f"a record has neither --messages-field {self.messages_field!r} nor "
                f"--prompt-field/--response-field {', '.join(missing)!r} (it has {sorted(record)})"
            )
        prompt = "\n\n".join(str(record[f]) for f in self.prompt_fields if record[f])
        return [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": str(record[self.response_field])},
        ]

    def _render(self, messages: Sequence[dict[str, str]], *, generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    def response_spans(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[range]]:
        """The rendered chat and the character ranges of the assistant turns in it.

        Each span runs from the end of the conversation-so-far with a generation prompt to the
        end of the conversation including that turn, so it holds exactly what the model must
        generate (its end-of-turn tokens included, trailing whitespace not). A template that
        renders earlier turns differently once later ones follow (some drop past reasoning)
        makes only the last assistant turn a target.
        """
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return "", []
        full = self._render(messages[: turns[-1] + 1], generation_prompt=False)
        spans: list[range] = []
        for i in turns:
            prefix = self._render(messages[:i], generation_prompt=True)
            upto = self._render(messages[: i + 1], generation_prompt=False)
            if not (full.startswith(upto) and upto.startswith(prefix)):
                prefix = self._render(messages[: turns[-1]], generation_prompt=True)
                if not full.startswith(prefix):
                    raise DataError(
                        "the chat template does not render a conversation as its prefix plus "
                        "the reply; --objective sft cannot tell the response tokens"
                    )
                return full, [range(len(prefix), len(full.rstrip()))]
            spans.append(range(len(prefix), len(upto.rstrip())))
        return full, spans

    def _encode_chat(self, messages: list[dict[str, str]]) -> Document | None:
        text, spans = self.response_spans(messages)
        if not spans:
            return None
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        mask = np.zeros(len(ids), dtype=bool)
        for index, (start, end) in enumerate(encoded["offset_mapping"]):
            if end > start and any(start >= s.start and end <= s.stop for s in spans):
                mask[index] = True
        return self._document(ids, mask)

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @staticmethod
    def _document(ids: list[int], mask: np.ndarray) -> Document | None:
        if len(ids) < 2 or not mask[1:].any():
            return None
        return Document(np.asarray(ids, dtype=np.int64), mask)


# ---- the per-worker stream and its packing ----------------------------------------------------


Position = tuple[int, int, int]  # (epoch, unit slot in this worker's epoch order, record)


class TextBatches:
    """Packed batches of one worker, resumable from :meth:`state_dict`.

    ``split_documents``: a document may continue in the next row (clm); otherwise it is placed
    whole and the row padded (sft). ``state`` is what :meth:`state_dict` returned at a step.
    """

    counts_vary = True

    def __init__(
        self,
        units: Sequence[Unit],
        encoder: Encoder | Callable[[Any], Document | None],
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        split_documents: bool,
        pad_id: int,
        state: dict[str, Any] | None = None,
    ) -> None:
        if not units:
            raise DataError("--data has no records")
        self.units = list(units)
        self._encode = encoder.encode if isinstance(encoder, Encoder) else encoder
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.split_documents = split_documents
        self.pad_id = pad_id
        self.stride_records = len(self.units) < world_size
        self.documents = 0
        start: Position = (0, 0, 0)
        offset = 0
        if state is not None:
            start, offset = self._restore(state)
        self._docs = self._stream(start)
        self._pending: list[Any] | None = None  # [position, document, pairs used]
        self._next: Position = start
        if offset:
            position, doc = next(self._docs)
            if position != start:
                raise DataError(
                    f"the data changed since the checkpoint: record {start} is not where it was"
                )
            self._pending = [position, doc, offset]

    def _restore(self, state: dict[str, Any]) -> tuple[Position, int]:
        self.documents = int(state.get("documents", 0))
        if int(state.get("world_size", self.world_size)) != self.world_size:
            # The sharding changed: no rank's position carries over. Start the next epoch.
            return (int(state["epoch"]) + 1, 0, 0), 0
        return (int(state["epoch"]), int(state["unit"]), int(state["record"])), int(state["offset"])

    def _epoch_units(self, epoch: int) -> list[int]:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.units))
        return [
            int(u) for u in (order if self.stride_records else order[self.rank :: self.world_size])
        ]

    def _unit_items(self, epoch: int, unit_index: int) -> Iterator[tuple[int, Any]]:
        unit = self.units[unit_index]
        rng = np.random.default_rng([self.seed, epoch, unit_index, 1])
        if unit.kind == "hf":
            yield from enumerate(_window_shuffle(read_unit(unit), rng, STREAM_WINDOW))
            return
        items = list(read_unit(unit))
        for j, index in enumerate(rng.permutation(len(items))):
            yield j, items[int(index)]

    def _stream(self, start: Position) -> Iterator[tuple[Position, Document]]:
        epoch, first_slot, first_record = start
        while True:
            whole_epoch = first_slot == 0 and first_record == 0
            produced = False
            slots = self._epoch_units(epoch)
            for slot in range(first_slot, len(slots)):
                unit = self.units[slots[slot]]
                for j, item in self._unit_items(epoch, slots[slot]):
                    if j < first_record:
                        continue
                    if self.stride_records and j % self.world_size != self.rank:
                        continue
                    doc = self._encode(parse_item(unit, item))
                    if doc is not None:
                        produced = True
                        yield (epoch, slot, j), doc
                first_record = 0
            if whole_epoch and not produced:
                raise DataError(
                    f"--data gives worker {self.rank} of {self.world_size} nothing to train on "
                    "(no records, or none with a target token)"
                )
            epoch, first_slot = epoch + 1, 0

    def _row(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        length = self.seq_len
        ids = np.full(length, self.pad_id, dtype=np.int64)
        labels = np.full(length, IGNORE, dtype=np.int64)
        positions = np.zeros(length, dtype=np.int64)
        fill = 0
        while fill < length:
            if self._pending is None:
                position, doc = next(self._docs)
                if not self.split_documents and len(doc.ids) > length + 1:
                    doc = Document(doc.ids[: length + 1], doc.mask[: length + 1])
                    if not doc.mask[1:].any():
                        continue  # nothing left to learn once cut to the row
                self._pending = [position, doc, 0]
            position, doc, used = self._pending
            pairs = len(doc.ids) - 1
            take = min(pairs - used, length - fill)
            if not self.split_documents and take < pairs - used:
                positions[fill:] = np.arange(length - fill)  # pad: a segment of its own
                break
            ids[fill : fill + take] = doc.ids[used : used + take]
            targets = doc.ids[used + 1 : used + take + 1]
            labels[fill : fill + take] = np.where(
                doc.mask[used + 1 : used + take + 1], targets, IGNORE
            )
            positions[fill : fill + take] = np.arange(take)
            fill += take
            used += take
            if used >= pairs:
                self._pending = None
                self.documents += 1
                epoch, slot, record = position
                self._next = (epoch, slot, record + 1)
            else:
                self._pending[2] = used
        return ids, labels, positions

    def next_batch(self) -> Batch:
        rows = [self._row() for _ in range(self.batch_size)]
        ids, labels, positions = (np.stack(parts) for parts in zip(*rows, strict=True))
        return Batch(
            input_ids=torch.from_numpy(ids),
            labels=torch.from_numpy(labels),
            position_ids=torch.from_numpy(positions),
            n_targets=int((labels != IGNORE).sum()),
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands after the last batch (JSON-serializable)."""
        if self._pending is not None:
            (epoch, slot, record), offset = self._pending[0], int(self._pending[2])
        else:
            (epoch, slot, record), offset = self._next, 0
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "unit": slot,
            "record": record,
            "offset": offset,
            "documents": self.documents,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    @property
    def epoch(self) -> int:
        return int(self.state_dict()["epoch"])


def _window_shuffle(items: Iterator[Any], rng: np.random.Generator, window: int) -> Iterator[Any]:
    """A bounded-memory shuffle of a stream: hold ``window`` items, emit one at random."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < window:
            buffer.append(item)
            continue
        index = int(rng.integers(len(buffer)))
        yield buffer[index]
        buffer[index] = item
    order = rng.permutation(len(buffer))
    for index in order:
        yield buffer[int(index)]
