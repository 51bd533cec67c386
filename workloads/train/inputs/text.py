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

Reading is workloads/train/inputs/text_units.py, encoding workloads/train/inputs/text_encode.py;
the stream and its packing are here. No DataLoader worker processes: batches are made on the
training thread. Forking after the TPU runtime and Ray's gRPC threads start can deadlock (Google's
TorchTPU fine-tuning sample keeps ``num_workers=0`` for that reason), and tokenizing a batch
costs little next to a step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from workloads.train.inputs.batches import IGNORE, Batch, DataError
from workloads.train.inputs.text_encode import Document, Encoder
from workloads.train.inputs.text_units import UNIT_BYTES, Unit, parse_item, plan_units, read_unit

# The reading and the encoding live in their own modules; these names stay importable here.
__all__ = [
    "STATE_VERSION",
    "STREAM_WINDOW",
    "UNIT_BYTES",
    "Document",
    "Encoder",
    "TextBatches",
    "Unit",
    "parse_item",
    "plan_units",
    "read_unit",
]

STREAM_WINDOW = 4096  # records shuffled together when a unit cannot be read whole (hub shards)
STATE_VERSION = 1


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
