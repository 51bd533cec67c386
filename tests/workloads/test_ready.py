"""Workloads wait for a model folder another job writes, they don't die (issue 27, item 4).

The trainer waits for its staged copy's marker (stage.py writes it last) and the serving
replica for the export's (export.py writes it last); both through workloads/ready.py, with a
stated bound and a message that says what to do at it. The markers a writer writes are the
ones a reader waits for (workloads/protocol.py): checked against the writers' own code here.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from workloads import protocol, ready
from workloads.flags import ConfigError
from workloads.train import stage
from workloads.train.config_check import parse_args


class Said:
    """The lines a wait says, and an event once it said it waits (no sleeping in tests)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.waiting = threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith(protocol.WAITING_PREFIX):
            self.waiting.set()

    def records(self, kind: str) -> list[dict[str, object]]:
        parsed = [protocol.parse_line(line) for line in self.lines]
        return [p[1] for p in parsed if p is not None and p[0] == kind]


def test_the_writers_write_the_markers_the_readers_wait_for() -> None:
    from workloads.train.outputs import export

    assert stage.MARKER == protocol.STAGED_MARKER
    assert export.MARKER_NAME == protocol.EXPORT_MARKER
    assert set(protocol.COMPLETION_MARKERS) == {stage.MARKER, export.MARKER_NAME}


def test_a_marker_that_appears_late_ends_the_wait(tmp_path: Path) -> None:
    """A thread stages the folder once the reader says it waits: the race lost, survived."""
    folder = tmp_path / "models" / "org" / "m"
    said = Said()

    def writer() -> None:
        said.waiting.wait(timeout=60)
        listing = stage.Listing("abc", (("config.json", 2),))
        stage.stage("org/m", str(folder), listing, lambda name: _bytes(b"{}"))

    thread = threading.Thread(target=writer)
    thread.start()
    waited = ready.wait_for_model(
        str(folder), timeout_s=60, who="--model", writer="the stage Job", poll_s=0.01, say=said
    )
    thread.join()
    assert waited.marker == protocol.STAGED_MARKER
    assert (folder / "config.json").read_text() == "{}"
    (start,) = said.records(protocol.WAITING)
    assert start["folder"] == str(folder) and start["timeout_s"] == 60
    (end,) = said.records(protocol.WAITED)
    assert end["marker"] == protocol.STAGED_MARKER and end["seconds"] == waited.seconds > 0


def test_a_complete_folder_is_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / protocol.EXPORT_MARKER).write_text("{}")
    said = Said()
    waited = ready.wait_for_model(str(tmp_path), timeout_s=5, who="x", writer="y", say=said)
    assert waited.marker == protocol.EXPORT_MARKER
    assert not said.waiting.is_set()
    assert said.records(protocol.WAITED)[0]["seconds"] == waited.seconds


def test_a_folder_without_its_marker_is_not_complete(tmp_path: Path) -> None:
    """Files without the marker are a copy still being written: the reader keeps waiting."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert ready.found_marker(str(tmp_path)) is None
    assert ready.found_marker(str(tmp_path), (protocol.EXPORT_MARKER,)) is None


def test_the_bound_fails_with_a_message_that_says_what_to_do(tmp_path: Path) -> None:
    """A clock and sleep of our own: the bound is reached without waiting for it."""
    now = [0.0]
    said = Said()

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(ready.ModelNotReady) as raised:
        ready.wait_for_model(
            str(tmp_path / "never"),
            timeout_s=300,
            who="--model",
            writer="its stage Job",
            poll_s=2,
            clock=lambda: now[0],
            sleep=sleep,
            say=said,
        )
    message = str(raised.value)
    assert now[0] == 300  # it stopped at the bound, not before, not after
    for part in (str(tmp_path / "never"), "300s", protocol.STAGED_MARKER, "its stage Job"):
        assert part in message, part
    # it said what it waits for at the start and every minute: 0, 60, ..., 240 s
    assert len([line for line in said.lines if "waiting for" in line]) == 5


def test_the_trainer_fails_at_its_bound_with_the_message(tmp_path: Path) -> None:
    """`python -m workloads.train --model FOLDER --model-wait-s N`: the driver waits before it
    starts Ray, and at the bound ends the run failed, saying why (no Ray, no workers)."""
    from workloads.train import launcher

    folder = tmp_path / "models" / "org" / "m"
    cfg = parse_args(["--model", str(folder), "--model-wait-s", "1", "--accelerator", "cpu"])
    summary = launcher.run(cfg)
    assert summary["status"] == "failed"
    assert "not complete after" in str(summary["error"]) and str(folder) in str(summary["error"])


def test_model_wait_needs_a_folder() -> None:
    with pytest.raises(ConfigError, match="--model-wait-s"):
        parse_args(["--model", "Qwen/Qwen3-1.7B", "--model-wait-s", "60"])
    with pytest.raises(ConfigError, match="--model-wait-s"):
        parse_args(["--model-wait-s", "60"])
    with pytest.raises(ConfigError, match="--model-wait-s"):
        parse_args(["--model", "/data/m", "--model-wait-s", "-1"])
    assert parse_args(["--model", "gs://b/m", "--model-wait-s", "60"]).model_wait_s == 60


def test_stage_from_a_local_folder_is_the_stage_module_with_another_source(tmp_path: Path) -> None:
    """`park local`'s hub: a folder, staged by the stage module's own code (its marker last)."""
    hub = tmp_path / "hub"
    (hub / "sub").mkdir(parents=True)
    (hub / "config.json").write_text('{"a": 1}')
    (hub / "sub" / "tokenizer.json").write_text("{}")
    (hub / ".hidden").write_text("no")
    dest = tmp_path / "bucket" / "models" / "org" / "m"
    assert stage.main(["--repo", "org/m", "--dest", str(dest), "--from-folder", str(hub)]) == 0
    assert (dest / "config.json").read_text() == '{"a": 1}'
    assert (dest / "sub" / "tokenizer.json").exists() and not (dest / ".hidden").exists()
    assert ready.found_marker(str(dest)) == protocol.STAGED_MARKER
    first = stage.folder_listing(str(hub))
    assert stage.folder_listing(str(hub)) == first  # a revision named by the files
    (hub / "config.json").write_text('{"a": 22}')
    assert stage.folder_listing(str(hub)).revision != first.revision


def _bytes(data: bytes):  # type: ignore[no-untyped-def]
    import contextlib
    import io

    return contextlib.nullcontext(io.BytesIO(data))
