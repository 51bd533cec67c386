"""Text and chat data for Hugging Face models: units, records, SFT masks, packing, order, resume.

No model and no process group: the tokenizer is park:tiny-llama's (built once, cached).
"""

from __future__ import annotations

import json
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.workloads.train_fixtures import (  # noqa: F401  (fixtures)
    one_rank_batches,
    tiny_llama_folder,
    tiny_tokenizer,
)
from workloads.train.inputs import facts, text
from workloads.train.inputs.batches import IGNORE, DataError


def _records(n: int) -> list[dict[str, Any]]:
    return [{"text": f"record number {i} says hello", "id": i} for i in range(n)]


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _ids(units: list[text.Unit]) -> list[int]:
    return [text.parse_item(u, item)["id"] for u in units for item in text.read_unit(u)]


# ---- units ------------------------------------------------------------------------------------


def test_byte_ranges_split_a_file_into_whole_lines_each_read_once(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "a.jsonl", _records(200))
    units = text.plan_units(str(path), unit_bytes=97)  # not a multiple of any line length
    assert len(units) > 20
    assert _ids(units) == list(range(200))


def test_formats_folders_and_gs_style_uris(tmp_path: Path) -> None:
    """jsonl, a .json array, parquet row groups and txt lines; file:// goes through pyarrow's
    filesystem layer like gs:// does."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    _write_jsonl(root / "a.jsonl", _records(3))
    (root / "b.json").write_text(json.dumps([{"text": "from an array", "id": 100}]))
    pq.write_table(
        pa.Table.from_pylist([{"text": f"row {i}", "id": 200 + i} for i in range(10)]),
        root / "sub" / "c.parquet",
        row_group_size=4,
    )
    (root / "d.txt").write_text("line one\n\nline two\n")
    (root / "README.md").write_text("not data")

    units = text.plan_units(f"file://{root}")
    kinds = Counter(u.kind for u in units)
    assert kinds == {"lines": 2, "json": 1, "parquet": 3}
    assert all(u.uri.startswith("file://") for u in units)
    items = {
        u.kind + (u.options[0] if u.options else ""): [
            text.parse_item(u, i) for i in text.read_unit(u)
        ]
        for u in units
        if u.kind != "parquet"
    }
    assert items["lines.txt"] == ["line one", "line two"]
    assert [r["id"] for r in items["lines.jsonl"]] == [0, 1, 2]
    assert items["json"] == [{"text": "from an array", "id": 100}]
    rows = [r["id"] for u in units if u.kind == "parquet" for r in text.read_unit(u)]
    assert rows == list(range(200, 210))


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        text.plan_units(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.md").write_text("hi")
    with pytest.raises(DataError, match=r"no \.jsonl"):
        text.plan_units(str(tmp_path))


def test_hub_data_sets_stream_by_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hf:NAME:CONFIG`` through `datasets` (a stand-in module: there is no network here)."""
    calls: list[tuple[Any, ...]] = []

    class Stream:
        num_shards = 3

        def shard(self, num_shards: int, index: int) -> list[dict[str, Any]]:
            return [{"text": f"shard {index} row {r}", "id": index * 10 + r} for r in range(2)]

    def load_dataset(repo: str, config: str | None, split: str, streaming: bool) -> Stream:
        calls.append((repo, config, split, streaming))
        return Stream()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    units = text.plan_units("hf:org/set:cfg", split="validation")
    assert [(u.kind, u.start, u.end) for u in units] == [("hf", i, 3) for i in range(3)]
    assert calls[0] == ("org/set", "cfg", "validation", True)
    assert [r["id"] for u in units for r in text.read_unit(u)] == [0, 1, 10, 11, 20, 21]


def test_hub_data_sets_need_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match="needs the `datasets` package"):
        text.plan_units("hf:tatsu-lab/alpaca")


# ---- records to documents ---------------------------------------------------------------------


def test_clm_documents_are_bos_text_eos(tiny_tokenizer: Any) -> None:
    encoder = text.Encoder(tiny_tokenizer, objective="clm")
    doc = encoder.encode({"text": "The capital of Zofevia is Zagesk."})
    assert doc is not None
    assert doc.ids[0] == tiny_tokenizer.bos_token_id and doc.ids[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(doc.ids[1:-1]) == "The capital of Zofevia is Zagesk."
    assert doc.mask[1:].all()
    with pytest.raises(DataError, match="--text-field 'body'"):
        text.Encoder(tiny_tokenizer, objective="clm", text_field="body").encode({"text": "x"})


def _targets(tokenizer: Any, doc: text.Document) -> str:
    return str(tokenizer.decode(doc.ids[doc.mask]))


def test_sft_targets_are_exactly_the_assistant_turns(tiny_tokenizer: Any) -> None:
    encoder = text.Encoder(tiny_tokenizer, objective="sft")
    chat = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of Zofevia?"},
        {"role": "assistant", "content": "Zagesk."},
        {"role": "user", "content": "And its language?"},
        {"role": "assistant", "content": "Duvaese."},
    ]
    doc = encoder.encode({"messages": chat})
    assert doc is not None
    assert _targets(tiny_tokenizer, doc) == "Zagesk.</s>Duvaese.</s>"
    rendered = tiny_tokenizer.decode(doc.ids)
    assert rendered == tiny_tokenizer.apply_chat_template(chat, tokenize=False)
    # Nothing of the prompts is a target: not one token of the questions or the roles.
    prompt_ids = set(
        tiny_tokenizer("What is the capital of Zofevia? And its language?")["input_ids"]
    )
    assert not prompt_ids & set(doc.ids[doc.mask].tolist())


def test_sft_prompt_and_response_fields(tiny_tokenizer: Any) -> None:
    alpaca = text.Encoder(
        tiny_tokenizer, objective="sft", prompt_field="instruction,input", response_field="output"
    )
    doc = alpaca.encode(
        {"instruction": "Name the capital.", "input": "Zofevia", "output": "Zagesk."}
    )
    assert doc is not None
    assert _targets(tiny_tokenizer, doc) == "Zagesk.</s>"
    assert "Name the capital.\n\nZofevia" in tiny_tokenizer.decode(doc.ids)
    with pytest.raises(DataError, match="--prompt-field/--response-field"):
        alpaca.encode({"question": "?"})
    assert (
        text.Encoder(tiny_tokenizer, objective="sft").encode(
            {"messages": [{"role": "user", "content": "no reply"}]}
        )
        is None
    )


def test_sft_needs_a_chat_template(tiny_tokenizer: Any) -> None:
    plain = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = None
    with pytest.raises(DataError, match="chat template"):
        text.Encoder(plain, objective="sft")


# ---- packing, order, resume -------------------------------------------------------------------


def _counter_encoder(length: int = 5) -> Any:
    """Record ``{"id": i}`` → a document of ``length`` tokens, all ``i + 10``, all targets."""

    def encode(record: Any) -> text.Document:
        ids = np.full(length, record["id"] + 10, dtype=np.int64)
        return text.Document(ids, np.ones(length, dtype=bool))

    return encode


def _batches(units: list[text.Unit], **overrides: Any) -> text.TextBatches:
    options = {"seq_len": 8, "batch_size": 2, "split_documents": True, "pad_id": 0} | overrides
    encoder = options.pop("encoder", _counter_encoder())
    return one_rank_batches(units, encoder, **options)


def _units(tmp_path: Path, n: int, **kw: Any) -> list[text.Unit]:
    return text.plan_units(str(_write_jsonl(tmp_path / "d.jsonl", _records(n))), **kw)


def test_rows_pack_documents_with_restarting_positions(tmp_path: Path) -> None:
    batch = _batches(_units(tmp_path, 4), batch_size=1, seq_len=12).next_batch()
    ids, labels, pos = (t[0].tolist() for t in (batch.input_ids, batch.labels, batch.position_ids))
    # Three documents of 5 tokens give 4 (input, target) pairs each: 4 + 4 + 4 = 12 positions.
    assert pos == [0, 1, 2, 3] * 3
    assert [ids[0], ids[4], ids[8]] != [ids[0]] * 3, "three different documents"
    for start in (0, 4, 8):
        assert labels[start : start + 4] == [ids[start]] * 4  # same-document next tokens
    assert batch.n_targets == 12


def test_clm_splits_a_long_document_and_sft_pads_instead(tmp_path: Path) -> None:
    units = _units(tmp_path, 3)
    split = _batches(units, seq_len=6, batch_size=2).next_batch()
    # 4 pairs of document A, 2 of B; then B's last 2 pairs continue the next row.
    assert split.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 0, 1, 2, 3]]
    assert (split.labels != IGNORE).all()
    whole = _batches(units, seq_len=6, batch_size=2, split_documents=False).next_batch()
    assert whole.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]]
    assert whole.labels[:, 4:].eq(IGNORE).all() and whole.input_ids[:, 4:].eq(0).all()
    assert whole.n_targets == 8


def _seen(batches: text.TextBatches, steps: int) -> list[int]:
    ids = [batches.next_batch().input_ids for _ in range(steps)]
    return [int(v) - 10 for t in ids for v in t.flatten().tolist() if v]


@pytest.mark.parametrize(("records", "unit_bytes"), [(40, 1 << 20), (40, 64)])
def test_workers_share_an_epoch_without_overlap(
    tmp_path: Path, records: int, unit_bytes: int
) -> None:
    """One unit (records strided over workers) or many (units dealt out): each record is seen
    by exactly one of 2 workers in an epoch; the order depends on the seed."""
    units = _units(tmp_path, records, unit_bytes=unit_bytes)
    encoder = _counter_encoder(length=2)  # one position per document: ids are record ids
    per_rank = []
    for rank in (0, 1):
        stream = _batches(units, encoder=encoder, rank=rank, world_size=2, batch_size=1, seq_len=1)
        docs = []
        while stream.epoch == 0:
            docs.append(int(stream.next_batch().input_ids) - 10)
        per_rank.append(docs[:-1])  # the last one read is already epoch 1's
    assert sorted(per_rank[0] + per_rank[1]) == list(range(records))
    again = _batches(units, encoder=encoder, rank=0, world_size=2, batch_size=1, seq_len=1)
    assert _seen(again, 5) == per_rank[0][:5]
    other = _batches(units, encoder=encoder, rank=0, world_size=2, batch_size=1, seq_len=1, seed=1)
    assert _seen(other, 10) != per_rank[0][:10]


@pytest.mark.parametrize("split_documents", [True, False])
def test_resume_continues_with_the_next_token(tmp_path: Path, split_documents: bool) -> None:
    units = _units(tmp_path, 9, unit_bytes=120)
    straight = _batches(units, seq_len=7, split_documents=split_documents)
    first = [straight.next_batch() for _ in range(5)]
    state = json.loads(json.dumps(straight.state_dict()))  # through JSON, as in a checkpoint
    rest = [straight.next_batch() for _ in range(12)]  # into the next epochs
    assert state["offset"] or not split_documents, "the cut falls inside a document"
    resumed = _batches(units, seq_len=7, split_documents=split_documents, state=state)
    for a, b in zip(rest, (resumed.next_batch() for _ in range(12)), strict=True):
        assert a.input_ids.equal(b.input_ids) and a.labels.equal(b.labels)
    assert first[0].input_ids.ne(rest[0].input_ids).any()
    assert resumed.state_dict() == straight.state_dict()


def test_a_new_world_size_starts_the_next_epoch(tmp_path: Path) -> None:
    units = _units(tmp_path, 6)
    state = _batches(units).state_dict() | {"epoch": 2, "record": 3, "offset": 1}
    moved = _batches(units, rank=1, world_size=3, state=state)
    assert (moved.state_dict()["epoch"], moved.state_dict()["record"]) == (3, 0)


def test_a_worker_without_records_is_told(tmp_path: Path) -> None:
    units = _units(tmp_path, 1)
    with pytest.raises(DataError, match="worker 1 of 2 nothing to train on"):
        _batches(units, rank=1, world_size=2).next_batch()


# ---- the shipped facts ------------------------------------------------------------------------


def test_shipped_facts_are_the_generated_ones() -> None:
    assert facts.SHIPPED.read_text() == facts.render()
    questions = facts.questions()
    assert len(questions) == 2 * facts.COUNTRIES
    assert len(set(questions.values())) == len(questions), "every answer is unique"
    assert facts.facts_path().read_text() == facts.render()


def test_facts_are_a_few_tokens_each(tiny_tokenizer: Any) -> None:
    encoder = text.Encoder(tiny_tokenizer, objective="sft")
    lengths = [len(encoder.encode(r).ids) for r in facts.records()]  # type: ignore[union-attr]
    assert max(lengths) <= 24
