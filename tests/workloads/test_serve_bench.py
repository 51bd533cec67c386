"""benchmarks/serve: the parts that decide what is reported, and the isolation of its passes
(proved on small stand-in servers: no vLLM or Ray server is started here)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.serve import cli, cpu, gpu, load, passes, profile, servers, stats  # noqa: E402


def _trial(
    tok_s: float,
    ttft: float,
    groups: dict[str, float] | None = None,
    control_plane_cores: float = 0.0,
) -> dict[str, Any]:
    """One pass's record as ``load.trial`` writes it; ``groups``: CPU ms per request by group."""
    groups = groups or {"engine_core": 10.0}
    ms = {"mean": ttft, "p50": ttft, "p99": ttft}
    return {
        "output_tokens_per_s": tok_s,
        "requests_per_s": tok_s / 64,
        "ttft_ms": ms,
        "tpot_ms": ms,
        "itl_ms": ms,
        "e2el_ms": ms,
        "server_cpu_s_per_1k_tokens": 1.0,
        "failed": 0,
        "server_cpu_ms_per_request": groups,
        "cpu_ms_per_request_by_role": cpu.by_role(groups),
        "control_plane_cpu_s_per_s": control_plane_cores,
        "other_jobs_cpu_s": 0.0,
        "load_average_1m": [0.0, 0.0],
    }


def test_plain_client_argv_is_what_vllm_bench_serve_parses() -> None:
    """The benchmark's argv goes through vLLM's own `bench serve` parser to the goal's cell."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(load.client_argv("http://h:1", "/m", "served"))
    assert (args.backend, args.endpoint, args.base_url) == (
        "openai",
        "/v1/completions",
        "http://h:1",
    )
    assert (args.max_concurrency, args.num_prompts, args.num_warmups) == (8, 640, 8)
    assert args.num_prompts == cli.prompts_for(8, None)  # the plain command is the goal's cell
    assert (args.random_input_len, args.random_output_len, args.ignore_eos) == (64, 64, True)
    assert args.temperature == 0.0


def test_figures_are_medians_over_rounds_not_the_best() -> None:
    bare = [_trial(1000, 40), _trial(1200, 30), _trial(600, 90)]
    ray = [_trial(800, 60), _trial(1080, 45), _trial(300, 180)]
    summary = stats.summary(ray)
    assert summary["output_tokens_per_s"]["median"] == 800
    assert (summary["mean_ttft_ms"]["min"], summary["mean_ttft_ms"]["max"]) == (45, 180)
    ratio = stats.ratios(ray, bare)
    assert ratio["output_tokens_per_s"]["paired"]["trials"] == [0.8, 0.9, 0.5]
    assert ratio["output_tokens_per_s"]["paired"]["median"] == 0.8
    assert ratio["mean_ttft_ms"]["paired"]["median"] == 1.5
    assert ratio["output_tokens_per_s"]["of_medians"] == round(800 / 1000, 3)


def _cell(ray: list[dict[str, Any]], bare: list[dict[str, Any]], reliable: bool) -> dict[str, Any]:
    return {
        "completions/c8": {
            "ratio": {"ray": stats.ratios(ray, bare)},
            "self_check": {"reliable": reliable},
        }
    }


def test_goal_is_judged_only_when_the_whole_spread_of_the_ratio_is_on_one_side() -> None:
    bare = [_trial(1000, 40), _trial(1000, 40), _trial(1000, 40)]
    holds = [_trial(950, 50), _trial(920, 44), _trial(990, 58)]  # 0.92-0.99x, 1.10-1.45x
    verdict = stats.goals(_cell(holds, bare, True), "ray")
    assert (verdict["throughput"]["says"], verdict["mean_ttft"]["says"]) == (stats.HOLDS,) * 2
    assert verdict["all_hold"]
    fails = [_trial(850, 70), _trial(800, 61), _trial(880, 90)]  # 0.80-0.88x, 1.52-2.25x
    verdict = stats.goals(_cell(fails, bare, True), "ray")
    assert (verdict["throughput"]["says"], verdict["mean_ttft"]["says"]) == (stats.FAILS,) * 2
    # A median that meets the goal is no verdict while one round falls short of it.
    straddles = [_trial(950, 50), _trial(850, 70), _trial(940, 50)]
    verdict = stats.goals(_cell(straddles, bare, True), "ray")
    assert verdict["throughput"]["median"] >= stats.GOAL_THROUGHPUT_RATIO
    assert verdict["throughput"]["says"] == stats.UNDECIDED and not verdict["all_hold"]
    # Nothing is judged where the self-check failed.
    verdict = stats.goals(_cell(holds, bare, False), "ray")
    assert not verdict["evaluated"] and not verdict["all_hold"]
    assert verdict["verdict"].startswith("NOT JUDGED")
    assert not stats.goals({}, "ray")["evaluated"]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1.0, 2.0, 3.0], [4.0, 5.0], "below"),
        ([4.0, 5.0], [1.0, 2.0, 3.0], "above"),
        ([1.0, 4.5], [4.0, 5.0], "overlap"),
        ([1.0, 4.0], [4.0, 5.0], "overlap"),  # touching spreads do not separate
        ([2.0, 3.0], [1.0, 5.0], "overlap"),  # one inside the other
    ],
)
def test_spreads_separate_only_when_every_round_of_one_is_beyond_every_round_of_the_other(
    a: list[float], b: list[float], expected: str
) -> None:
    assert stats.separation(a, b) == expected


def test_a_verdict_only_where_the_spreads_separate_and_the_self_check_held() -> None:
    bare = [_trial(1000, 40), _trial(1100, 35), _trial(900, 45)]
    slower = [_trial(700, 60), _trial(800, 55), _trial(750, 70)]
    out = stats.compare(slower, bare, "ray", {"reliable": True})
    assert out["output_tokens_per_s"]["spreads"] == "below"
    assert out["output_tokens_per_s"]["verdict"] == "ray below the bare server in every round"
    assert out["mean_ttft_ms"]["spreads"] == "above"
    assert out["output_tokens_per_s"]["ray"]["median"] == 750
    assert out["output_tokens_per_s"]["vllm"]["median"] == 1000
    close = [_trial(950, 41), _trial(1050, 30), _trial(1000, 50)]
    out = stats.compare(close, bare, "ray", {"reliable": True})
    assert out["output_tokens_per_s"]["spreads"] == "overlap"
    assert out["output_tokens_per_s"]["verdict"].startswith("no verdict: the spreads overlap")
    out = stats.compare(slower, bare, "ray", {"reliable": False})
    assert out["output_tokens_per_s"]["verdict"].startswith("no verdict: the self-check failed")
    out = stats.compare(slower, bare, "ray", {"reliable": False, "ran": False})
    assert out["output_tokens_per_s"]["verdict"] == "no verdict: the self-check did not run"


def test_self_check_is_reliable_only_when_bare_vs_bare_spans_one() -> None:
    bare = [_trial(1000, 40), _trial(1000, 40), _trial(1000, 40)]
    even = [_trial(980, 42), _trial(1030, 38), _trial(1000, 41)]  # 0.98-1.03x, 0.95-1.05x
    check = stats.self_check(even, bare)
    assert check["reliable"]
    assert (
        check["output_tokens_per_s"]["paired"]["min"],
        check["output_tokens_per_s"]["paired"]["max"],
    ) == (0.98, 1.03)
    assert "reliable" in check["verdict"] and "UNRELIABLE" not in check["verdict"]
    # One position favoured in every round (e.g. a side that pays for another's processes).
    skewed = [_trial(1100, 36), _trial(1050, 39), _trial(1200, 30)]
    check = stats.self_check(skewed, bare)
    assert not check["output_tokens_per_s"]["within"] and not check["mean_ttft_ms"]["within"]
    assert not check["reliable"] and "UNRELIABLE" in check["verdict"]
    # Throughput even but TTFT skewed: still unreliable.
    check = stats.self_check([_trial(1010, 50), _trial(990, 45), _trial(1000, 48)], bare)
    assert check["output_tokens_per_s"]["within"] and not check["reliable"]
    # A round exactly at 1.0 is within.
    assert stats.self_check([_trial(1000, 40)] * 2, bare[:2])["reliable"]


def test_cpu_outside_the_engine_is_the_sides_minus_the_bare_servers_per_round() -> None:
    bare = [
        _trial(1000, 40, {"engine_core": 50.0, "engine_worker": 60.0, "api_server": 14.0}),
        _trial(1000, 40, {"engine_core": 55.0, "engine_worker": 58.0, "api_server": 16.0}),
    ]
    ray = [
        _trial(
            900,
            50,
            {
                "engine_core": 40.0,
                "engine_worker": 50.0,
                "llm_server_replica": 15.0,
                "haproxy": 2.0,
                "llm_router_replica": 2.0,
                "serve_controller": 3.0,
                "gcs": 1.0,
            },
            control_plane_cores=0.15,
        ),
        _trial(
            950,
            45,
            {
                "engine_core": 45.0,
                "engine_worker": 45.0,
                "llm_server_replica": 17.0,
                "haproxy": 2.0,
                "llm_router_replica": 2.0,
                "serve_controller": 4.0,
                "gcs": 1.0,
                "dashboard": 0.8,  # seen in this round only
            },
            control_plane_cores=0.17,
        ),
    ]
    out = stats.outside_engine(ray, bare, output_len=64)
    # round 0: (15+2+2+3+1) - 14 = 9; round 1: (17+2+2+4+1+0.8) - 16 = 10.8. No engine in it.
    assert out["extra_ms_per_request"]["trials"] == [9.0, 10.8]
    assert out["extra_ms_per_request"]["median"] == 9.9
    assert out["extra_ms_per_token"] == round(9.9 / 64, 3)
    assert out["request_path_extra_ms_per_request"]["trials"] == [5.0, 5.0]
    assert out["control_plane_ms_per_request"]["trials"] == [4.0, 5.8]
    assert out["control_plane_cores"]["median"] == 0.16
    # The frontend is compared with the frontend: the LLM replica against the API server.
    assert out["extra_by_group_ms_per_request"]["frontend"] == 16.0 - 15.0
    assert out["extra_by_group_ms_per_request"]["serve_controller"] == 3.5
    assert out["extra_by_group_ms_per_request"]["dashboard"] == 0.4  # median of 0 and 0.8
    assert "engine_core" not in out["extra_by_group_ms_per_request"]
    # Ray's 23-26.8 ms against the bare server's 14-16 ms: the spreads separate, a verdict.
    cpu_verdict = stats.compare(ray, bare, "ray", {"reliable": True})
    assert cpu_verdict["cpu_ms_per_request_outside_engine"]["spreads"] == "above"


def test_report_marks_the_run_unreliable_when_the_self_check_fails() -> None:
    args = cli.parse(["--rounds", "3"])
    bare = [_trial(1000, 40), _trial(1000, 40), _trial(1000, 40)]
    ray = [_trial(950, 50), _trial(920, 44), _trial(990, 58)]
    known = servers.variants({})
    sides = cli.sides_of(args)
    cells = [("completions", 8)]

    def report(again: list[dict[str, Any]]) -> dict[str, Any]:
        results = {
            "vllm": {"completions/c8": bare},
            "vllm_check": {"completions/c8": again},
            "ray_serve_llm": {"completions/c8": ray},
        }
        return cli.build_report(args, "served", {}, known, sides, cells, results, [])

    even = report([_trial(990, 41), _trial(1010, 39), _trial(1000, 40)])
    assert even["reliable"] and even["goals"]["ray_serve_llm"]["all_hold"]
    assert even["cells"]["completions/c8"]["cpu_outside_engine"]["ray_serve_llm"]
    assert "vllm_check" not in even["goals"]
    skewed = report([_trial(1100, 36), _trial(1050, 39), _trial(1200, 30)])
    assert not skewed["reliable"] and not skewed["goals"]["ray_serve_llm"]["evaluated"]
    verdicts = skewed["cells"]["completions/c8"]["verdicts"]["ray_serve_llm"]
    assert all(v["verdict"].startswith("no verdict") for v in verdicts.values())


def test_the_two_bare_sides_take_mirrored_places_around_the_others() -> None:
    assert cli.sides_of(cli.parse([])) == ["vllm", "ray_serve_llm", "vllm_check"]
    sides = cli.sides_of(cli.parse(["--sides", "ray_defaults,ray_serve_llm", "--replica-direct"]))
    assert sides == ["vllm", "ray_defaults", "ray_serve_llm", "ray_replica_direct", "vllm_check"]
    assert cli.sides_of(cli.parse(["--no-self-check"])) == ["vllm", "ray_serve_llm"]
    rounds = cli.parse([]).rounds
    assert rounds >= 5 and rounds % 2 == 0
    with pytest.raises(SystemExit):
        cli.parse(["--rounds", "1"])
    schedule = passes.order(sides, rounds)
    last = len(sides) - 1
    for r in schedule:  # the self-check compares two places alike: mirrored in every round
        assert r.index("vllm") + r.index("vllm_check") == last
        assert {r.index("vllm"), r.index("vllm_check")} == {0, last}  # bracketing the others
    # Over the rounds every side is as often early in a round as late.
    for side in sides:
        places = [r.index(side) for r in schedule]
        assert sum(places) == rounds * last / 2, side


def test_serve_gpu_sh_runs_the_same_sides_and_rules() -> None:
    """The GPU script's own command line, parsed as the benchmark parses it: the self-check
    side, 5 rounds, each side alone (the same ``cli.run``)."""
    script = (ROOT / "benchmarks" / "serve_gpu.sh").read_text()
    (line,) = [ln for ln in script.splitlines() if ln.startswith("exec ")]
    words = shlex.split(line)
    argv = [w for w in words[words.index("benchmarks/serve_overhead.py") + 1 :] if w != "$@"]
    args = cli.parse(argv)
    assert args.gpu and args.profile and not args.no_self_check
    assert args.rounds == cli.DEFAULT_ROUNDS
    sides = cli.sides_of(args)
    known = gpu.variants(servers.rendered_serve_config(), "/models/qwen3-8b", {})
    assert sides == ["vllm", "ray_serve_llm", "vllm_check"] and set(sides) <= set(known)
    assert known["vllm_check"].config is None and known["vllm_check"].env == known["vllm"].env
    ray_side = known["ray_serve_llm"]
    assert ray_side.module == "benchmarks.serve.gpu" and ray_side.config is not None
    llm = ray_side.config["applications"][0]["args"]["llm_configs"][0]
    assert llm["accelerator_config"] == {"kind": "gpu"}
    assert llm["engine_kwargs"].items() >= gpu.ENGINE_KWARGS.items()


@pytest.mark.parametrize("where", ["cpu", "gpu"])
def test_the_bare_server_gets_the_engine_args_the_ray_side_gets(where: str, tmp_path: Path) -> None:
    """The bare server's command line, read by vLLM's own API-server parser into vLLM's own
    AsyncEngineArgs, equals the engine args built from the Ray side's ``engine_kwargs`` (what
    Ray Serve LLM hands vLLM)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from workloads.serve.cpu_profile import to_cpu

    model = str(tmp_path)  # a folder: vLLM takes a missing path for a hub id
    shipped = servers.rendered_serve_config()
    if where == "gpu":
        config = gpu.gpu_serve_config(shipped, model)
    else:
        config, _ = to_cpu(shipped, model, direct_streaming=False)
    kwargs = config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
    argv = servers.bare_argv(model, "served", 8101, servers.engine_flags(kwargs))
    parsed = AsyncEngineArgs.from_cli_args(
        make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    )
    ray_side = AsyncEngineArgs(model=model, **kwargs)
    assert kwargs
    for key in kwargs:
        assert getattr(parsed, key) == getattr(ray_side, key), key


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        (
            "a (x.py:1);Thread.run (threading.py:982);Metric._record (ray/util/metrics.py:133)",
            "metrics",
        ),
        (
            "main (m.py:1);Worker.main_loop (ray/_private/worker.py:1069)",
            "ray_core_worker_main_loop",
        ),
        ("x (uvicorn/protocols/http/httptools_impl.py:544)", "http_server"),
        ("g (vllm/v1/engine/detokenizer.py:10);decode (tokenizers/x.py:1)", "detokenize"),
        ("s (vllm/distributed/device_communicators/shm_broadcast.py:5)", "engine_shm_queue"),
        ("nothing (we.py:1)", "other"),
    ],
)
def test_profile_categories_take_the_leafmost_match(stack: str, expected: str) -> None:
    assert profile.category(stack) == expected


def test_budget_splits_exact_cpu_in_the_samples_shares() -> None:
    raw = "a (uvicorn/x.py:1) 30\nb (vllm/entrypoints/openai/s.py:2) 10\n"
    samples = {"llm_server_replica": profile.parse_raw(raw)}
    threads = {("llm_server_replica", "AsyncIO Thread: default"): 1.0}  # 1 s over 10 requests
    out = profile.budget(samples, threads, requests=10, output_len=64)["groups"]
    group = out["llm_server_replica"]
    assert group["cpu_ms_per_request"] == 100.0
    split = group["by_category_ms_per_request"]
    # 40 samples at 100 Hz = 0.4 s of Python: 40 ms per request, 3:1; the rest py-spy can't see
    assert (split["http_server"], split["openai_serving"]) == (30.0, 10.0)
    assert split["not_python (C++/native threads)"] == 60.0


def test_park_local_carries_the_pods_serve_env() -> None:
    """`park local` gives its Ray head what the rendered RayService's pods carry, so a local
    run serves as shipped (throughput mode, HAProxy, direct streaming, worker priority)."""
    from infra.plan import ray as ray_plan
    from infra.plan import serve_tuning
    from infra.stack import from_file
    from infra.tools.local.ray_head import pods_ray_env

    plan = from_file(ROOT / "stacks" / "Pulumi.dev.yaml")
    assert plan.serving is not None
    service = ray_plan.rayservice(plan.serving, ray_plan.ray_pods(plan), hf_token=False)
    env = pods_ray_env(service)
    assert serve_tuning.ray_env().items() <= env.items()
    assert pods_ray_env(None) == {}


# --- pass isolation, on stand-in servers -------------------------------------------------------

# A stand-in server: a child in its session without the tag in its environment (as Ray's agents)
# and a daemon that leaves the session with the tag; writes the three pids once all are up.
FAKE_SERVER = """
import json, os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
untagged = {k: v for k, v in os.environ.items() if k != "PARK_SERVE_BENCH_TAG"}
child = subprocess.Popen(sleep, env=untagged)
daemon = subprocess.Popen(sleep, start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump([os.getpid(), child.pid, daemon.pid], f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """From /proc, not from the code under test: the pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _session(pid: int) -> int | None:
    """A live process's session id, from /proc/PID/stat (field 6)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[3])


def _in_sessions(sids: set[int]) -> list[int]:
    """Live processes in any of ``sids``, from /proc."""
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and _running(int(e.name)) and _session(int(e.name)) in sids
    ]


def _tag_in_environ(pid: int) -> str | None:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, _, value = item.decode(errors="replace").partition("=")
        if key == servers.TAG_ENV:
            return value
    return None


def _tags_on_the_machine(run: str) -> set[str]:
    """Every live process's bench tag, read from /proc/PID/environ by hand."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _running(int(entry.name)):
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            key, _, value = item.decode(errors="replace").partition("=")
            if key == servers.TAG_ENV and value.startswith(f"{run}/"):
                found.add(value)
    return found


class StandIns:
    """``passes.Start`` for stand-in servers; remembers every pid each pass started."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pids: dict[str, list[int]] = {}
        self.sessions: dict[str, int] = {}

    @contextmanager
    def __call__(self, side: str, tag: str) -> Iterator[servers.Server]:
        ready = self.folder / f"{tag.replace('/', '-')}.json"
        cmd = [sys.executable, "-c", FAKE_SERVER, str(ready)]
        with servers.launched(cmd, self.folder / "log", {}, tag) as proc:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "stand-in died"
                time.sleep(0.05)
            self.pids[tag] = json.loads(ready.read_text())
            self.sessions[tag] = proc.pid
            yield servers.Server(side, "http://127.0.0.1:1", proc.pid)


def test_during_a_pass_no_process_of_another_side_is_alive(tmp_path: Path) -> None:
    run, start = passes.Run(f"t{os.getpid()}"), StandIns(tmp_path)
    seen = []
    for r, round_sides in enumerate(passes.order(["vllm", "vllm_check", "ray"], 2)):
        for side in round_sides:
            with passes.alone(run, side, f"round{r}", start, window_s=0.05) as server:
                mine = start.pids[server.tag]
                others = [p for tag, pids in start.pids.items() if tag != server.tag for p in pids]
                assert all(_running(p) for p in mine), f"{server.tag}: its processes are up"
                assert not [p for p in others if _running(p)], f"{server.tag}: others alive"
                other_sessions = {sid for tag, sid in start.sessions.items() if tag != server.tag}
                assert not _in_sessions(other_sessions), f"{server.tag}: other sessions alive"
                assert _tags_on_the_machine(run.id) == {server.tag}
                # What the trial checks at its main run's start and end passes here.
                run.check_alone(server.tag, "mid-pass")
                seen.append(server.tag)
                assert server.settle["settled"]
    assert len(seen) == 6 and len(set(seen)) == 6
    assert not [p for pids in start.pids.values() for p in pids if _running(p)]
    assert not _in_sessions(set(start.sessions.values()))
    assert _tags_on_the_machine(run.id) == set()


def test_a_pass_refuses_to_start_beside_a_live_process_of_the_run(tmp_path: Path) -> None:
    run, start = passes.Run(f"s{os.getpid()}"), StandIns(tmp_path)
    stray = f"{run.id}/ray/round0"
    with start("ray", stray):
        with (
            pytest.raises(passes.NotAlone, match="ray/round0"),
            passes.alone(run, "vllm", "round0", start, window_s=0.05),
        ):
            pass
        assert list(start.pids) == [stray]  # the second server was never started
        with pytest.raises(passes.NotAlone):
            run.check_alone(f"{run.id}/vllm/round0", "at the main run's start")
    # Stopped: the session's processes and the daemon that left the session are all gone.
    assert not [p for p in start.pids[stray] if _running(p)]
    assert _tags_on_the_machine(run.id) == set()


def test_a_pass_is_found_by_its_session_and_by_its_tag(tmp_path: Path) -> None:
    """The stand-in's child lost the tag (as Ray's agents do) and its daemon left the session:
    the run finds all three processes of the pass."""
    run, start = passes.Run(f"u{os.getpid()}"), StandIns(tmp_path)
    with passes.alone(run, "ray", "round0", start, window_s=0.05) as server:
        leader, child, daemon = start.pids[server.tag]
        assert _session(leader) == _session(child) == server.sid != _session(daemon)
        assert _tag_in_environ(child) is None and _tag_in_environ(daemon) == server.tag
        found = run.others_alive(f"{run.id}/vllm/round0")
        assert found == {server.tag: sorted([leader, child, daemon])}
        assert run.others_alive(server.tag) == {}
    assert not [p for p in (leader, child, daemon) if _running(p)]
