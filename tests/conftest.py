"""Shared fixtures (every shipped stack, rendered once per session under Pulumi mocks) and the
test tiers.

Tiers, named by cost. A test is *fast* (pure plan, rules, components under mocks, goldens)
unless it is of a slow kind: ``torch`` (process groups, real training steps, tracing a
real-size model), ``ray`` (a real local Ray cluster), ``serve`` (vLLM imported or loaded),
``e2e`` (a command end to end in a subprocess). A test gets its kind from its marker, or from
a fixture known to cost that much (``SLOW_FIXTURES``), so a new test that uses one is tiered
without a marker. Every test also carries ``fast`` or ``slow``: ``pytest -m fast`` is the inner
loop. ``pytest`` runs the fast tier first and stops there if it failed; then the tests of a
fixture started early (``EARLY_FIXTURES``: it came up beside the fast tier), then the slow kinds
in ``SLOW_KINDS`` order. A fast-tier test whose setup or call takes more than ``fast_test_cpu_s``
of CPU or ``fast_test_wall_s`` of wall time fails, saying so: it belongs in a slow tier, or
should be made fast.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT / "stacks"
SHIPPED_STACKS = sorted(
    p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml")
)

_rendered: dict[str, object] = {}


def render_stack(stack: str):
    """The stack rendered under mocks (cached: the Pulumi runtime is process-global)."""
    from infra.tools.render import render_stack_file

    if stack not in _rendered:
        _rendered[stack] = render_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml", stack)
    return _rendered[stack]


@pytest.fixture(params=SHIPPED_STACKS)
def rendered(request):
    return render_stack(request.param)


@pytest.fixture(autouse=True, scope="session")
def _offline_model_facts():
    """Model facts come from local folders and the committed catalogue in tests: the hub is
    never asked (the machine may be offline; answers would drift)."""
    import os

    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if previous is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = previous


# ---- Tiers --------------------------------------------------------------------------------------

SLOW_KINDS = ("torch", "ray", "serve", "e2e")  # the order the slow tiers run in
# Fixtures whose cost makes a test slow, wherever the test is written.
SLOW_FIXTURES = {
    "gloo_world1": "torch",  # a gloo process group (tests/workloads/train_fixtures.py)
    "local_ray": "ray",  # this process connected to the session's Ray head (train_fixtures.py)
    "local_server": "serve",  # vLLM behind Ray Serve in a subprocess (serve_fixtures.py)
}
RAY_HEAD_MODULE = "tests.workloads.train_fixtures"  # holds the shared head, once imported
# Fixtures started in the background when the session starts, if a selected test uses one: the
# fast tier runs in this one process and leaves the other core idle, and a subprocess that
# takes a minute to come up (vLLM's cold start) comes up there. The fixture takes what was
# started (``take_early``); its tests run right after the fast tier, while it is warm.
# name -> "module:function" that starts it and returns a handle with ``stop()``.
EARLY_FIXTURES = {
    "local_server": "tests.workloads.serve_fixtures:start_local_server",
    "serve_wait_probes": "tests.workloads.test_serve_wait:start_probes",
    "ray_llm_probe": "tests.workloads.test_serve_config:start_ray_llm_probe",
}
_early: dict[str, Any] = {}


def take_early(name: str) -> Any | None:
    """What the session started early for fixture ``name`` (once), or None."""
    return _early.pop(name, None)


@pytest.fixture(scope="session")
def ray_llm_probe(request: pytest.FixtureRequest):
    """The Ray LLM probe's stdout and the args it built (tests/workloads/test_serve_config.py),
    one process for the session: the one started early (EARLY_FIXTURES), or one started now."""
    from tests.workloads.test_serve_config import start_ray_llm_probe

    probe = take_early("ray_llm_probe") or start_ray_llm_probe(request.config)
    try:
        yield probe.result()
    finally:
        probe.stop()


EARLY_NICE = 10  # an early subprocess's priority: below the tests running beside it


def lower_priority(pid: int) -> None:
    """Start ``pid`` at EARLY_NICE (what it starts later inherits it); where that cannot be
    set, at the session's own."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, EARLY_NICE)


@dataclass
class Background:
    """A subprocess started at EARLY_NICE, its stdout and stderr in files; ``output`` waits."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @classmethod
    def start(
        cls, command: list[str], folder: Path, *, env: dict[str, str], cwd: Path, stdin: bytes = b""
    ) -> Background:
        out, err = folder / "stdout", folder / "stderr"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, env=env, cwd=cwd
            )
        lower_priority(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        return cls(proc, out, err)

    def output(self, timeout_s: float) -> str:
        """Its stdout once it ended (killed at the bound); it must have exited 0."""
        try:
            self.proc.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out = self.out.read_text(errors="replace")
        err = self.err.read_text(errors="replace")
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}\n{out[-2000:]}{err[-4000:]}"
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:  # never asked for (a failed fast tier ended the run)
            self.proc.terminate()  # a Ray driver shuts down the Ray it started
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The fast tier's limits per test phase (setup, call). The CPU limit holds on a busy
    machine too; the first test to import a library pays for it (transformers' model classes:
    ~2.5 s), so the limit sits above that: a fast-tier test takes ~0.04 s on average."""
    parser.addini("fast_test_cpu_s", "CPU seconds a fast-tier test phase may take", default="5")
    parser.addini("fast_test_wall_s", "wall seconds a fast-tier test phase may take", default="20")


def slow_kinds(item: pytest.Item) -> set[str]:
    """The slow kinds of a test: its markers' and its fixtures'."""
    kinds = {m.name for m in item.iter_markers() if m.name in SLOW_KINDS}
    fixtures = getattr(item, "fixturenames", ())
    return kinds | {kind for name, kind in SLOW_FIXTURES.items() if name in fixtures}


def _run_order(item: pytest.Item) -> int:
    """Fast first; then the tests of a fixture started early; then torch, ray (with the serve
    tests that need a Ray head, so that the session's head serves them all and stops once),
    serve, e2e."""
    kinds = slow_kinds(item)
    if not kinds:
        return 0
    if "e2e" in kinds:
        return 5
    if _early_fixtures(item):
        return 1
    if "ray" in kinds:
        return 3
    return 4 if "serve" in kinds else 2


def _early_fixtures(item: pytest.Item) -> set[str]:
    return set(EARLY_FIXTURES) & set(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not SHIPPED_STACKS:
        raise pytest.UsageError("no stacks/Pulumi.*.yaml found: nothing to test")
    for item in items:
        kinds = slow_kinds(item)
        for kind in sorted(kinds):
            item.add_marker(kind)  # a fixture's kind becomes selectable with -m too
        item.add_marker("slow" if kinds else "fast")


class _TierPlugin:
    """Orders the tiers, stops after a failed fast tier, checks fast tests are fast, reports
    each tier's time, and stops the shared Ray head once no test ahead needs it."""

    def __init__(self, config: pytest.Config) -> None:
        self.cpu_limit = float(config.getini("fast_test_cpu_s"))
        self.wall_limit = float(config.getini("fast_test_wall_s"))
        self.cpu: dict[str, float] = {}
        self.seconds: dict[str, float] = {}  # tier -> setup + call + teardown, summed
        self.count: dict[str, int] = {}
        self.kind_of: dict[str, str] = {}

    @pytest.hookimpl(trylast=True)  # after pytest grouped the items by fixture scope
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=_run_order)  # stable: each tier keeps pytest's order
        for item in items:
            kinds = slow_kinds(item)
            self.kind_of[item.nodeid] = "+".join(k for k in SLOW_KINDS if k in kinds) or "fast"

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Start the early fixtures the selected tests use (none for ``--collect-only``)."""
        if session.config.option.collectonly:
            return
        for name in sorted(set().union(*(_early_fixtures(item) for item in session.items))):
            module, function = EARLY_FIXTURES[name].split(":")
            _early[name] = getattr(importlib.import_module(module), function)(session.config)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        started = _cpu_seconds()
        yield
        self.cpu[item.nodeid] = _cpu_seconds() - started

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        started = _cpu_seconds()
        yield
        self.cpu[item.nodeid] = _cpu_seconds() - started

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """Sums each tier's time; fails a fast-tier test whose setup (its fixtures) or call
        took longer than the fast tier allows."""
        outcome = yield
        report = outcome.get_result()
        tier = self.kind_of.get(item.nodeid, "fast")
        self.seconds[tier] = self.seconds.get(tier, 0.0) + report.duration
        self.count[tier] = self.count.get(tier, 0) + (report.when == "call")
        cpu = self.cpu.pop(item.nodeid, 0.0)
        over = cpu > self.cpu_limit or report.duration > self.wall_limit
        if tier == "fast" and report.when != "teardown" and report.passed and over:
            report.outcome = "failed"
            report.longrepr = (
                f"tier check: {item.nodeid} is in the fast tier but its {report.when} took "
                f"{report.duration:.1f} s ({cpu:.1f} s of CPU; the fast tier allows "
                f"{self.cpu_limit:g} s of CPU, {self.wall_limit:g} s of wall). Mark it with its "
                f"kind ({', '.join(SLOW_KINDS)}; tests/conftest.py says which is which) or make "
                "it fast."
            )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        yield
        session = item.session
        here = self.kind_of.get(item.nodeid, "fast")
        ahead = "" if nextitem is None else self.kind_of.get(nextitem.nodeid, "fast")
        if here == "fast" and ahead not in ("", "fast") and session.testsfailed:
            session.shouldfail = (
                f"the fast tier failed ({session.testsfailed}): the slow tiers were not run "
                "(`pytest -m slow` runs them alone)"
            )
        if "ray" not in ahead.split("+"):
            _stop_shared_ray_head()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        _stop_shared_ray_head()
        for name in list(_early):  # started, never taken (a failed fast tier stops the run)
            _early.pop(name).stop()
        _kill_left_children(session)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.count:
            return
        terminalreporter.section("tiers")
        for tier in ("fast", *sorted(t for t in self.count if t != "fast")):
            if tier in self.count:
                terminalreporter.write_line(
                    f"{tier:>12}: {self.count[tier]:5d} tests {self.seconds.get(tier, 0.0):8.1f} s"
                )


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (load-independent)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _kill_left_children(session: pytest.Session) -> None:
    """A child process a test left running (a timed-out rank) would make Python's exit wait
    for it forever, after the summary: kill it, and fail the run that left it."""
    import multiprocessing

    left = multiprocessing.active_children()
    for child in left:
        child.kill()
        child.join(timeout=30)
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        sys.stderr.write(f"killed {len(left)} child process(es) a test left running\n")


def _stop_shared_ray_head() -> None:
    module = sys.modules.get(RAY_HEAD_MODULE)  # never imported: no head was started
    if module is not None:
        module.stop_shared_head()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_TierPlugin(config), "park-tiers")
