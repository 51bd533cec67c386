"""The two-rank runner the distributed tests use: a failed or hung rank fails the test at
once and leaves no process behind (a live child would keep pytest from exiting)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.workloads.train_fixtures import run_ranks

pytestmark = pytest.mark.torch


def _fail_or_hang(rank: int, pids: str) -> None:
    import os

    Path(pids, f".{rank}").write_text(str(os.getpid()))
    Path(pids, f".{rank}").rename(Path(pids, str(rank)))  # whole, or not there
    if rank == 0:
        deadline = time.monotonic() + 60
        while not Path(pids, "1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # rank 1 is up (its pid known) before rank 0 fails
        raise SystemExit(3)
    time.sleep(3600)  # the rank a collective would leave waiting


def _pid_alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_failed_rank_ends_the_run_and_no_rank_survives(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"\[3, None\]"):
        run_ranks(_fail_or_hang, (str(tmp_path),), timeout_s=120)
    assert time.monotonic() - started < 100  # not the 120 s bound: the failure ended it
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("[0-9]"))]
    assert len(pids) == 2 and not any(_pid_alive(pid) for pid in pids)


def test_a_hung_world_is_killed_at_the_bound(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"\[3, None\]|\[None, None\]"):
        run_ranks(_fail_or_hang, (str(tmp_path),), world_size=2, timeout_s=0.5)
    for pid_file in tmp_path.glob("[0-9]"):
        assert not _pid_alive(int(pid_file.read_text()))


def _return_leaving_a_thread(rank: int, queue: object) -> None:
    import threading

    threading.Thread(target=time.sleep, args=(3600,)).start()  # non-daemon: exit would wait
    queue.put(rank)  # type: ignore[attr-defined]


def test_a_rank_that_returned_ends_even_if_a_thread_would_hold_its_exit() -> None:
    """What a rank put in a queue arrives, and a thread left running (as a library's may be)
    does not keep the rank alive to the bound."""
    import multiprocessing

    queue = multiprocessing.get_context("spawn").Queue()
    started = time.monotonic()
    run_ranks(_return_leaving_a_thread, (queue,), timeout_s=120)
    assert time.monotonic() - started < 60
    assert sorted(queue.get(timeout=5) for _ in range(2)) == [0, 1]
