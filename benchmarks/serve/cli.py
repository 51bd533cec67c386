"""What Ray Serve LLM costs over the bare vLLM engine, as a client of the endpoint sees it.

Each side is measured alone (``passes``): every pass starts its side's server afresh, lets it
settle, runs the load and stops it, every process gone, before the next pass starts; nothing of
another side is alive during a pass, and the run checks that with the processes themselves. The
load is ``vllm bench serve`` itself (``load.client_argv``, the same argv as benchmarks/README.md's
plain command, its 8 warm-ups in every pass), run in process. Rounds interleave the sides (ABC,
CBA, ...); each figure is reported as its median and spread (min-max) over the rounds, each ratio
per round, and a verdict only where the spreads separate (``stats``). The self-check runs the
bare server as a second side (``vllm_check``): bare vs bare must span 1.0, else the cell is
marked unreliable. Beside the ratios: Ray's CPU per request outside the engine, by group (the
figure that carries to an accelerator host). By default every side is driven at the same offered
rate (``--rate``: a probe pass per side, then 0.6x the slower side's closed-loop rate; or
given), and ``matched`` reports each figure with a paired sign test and issue 39's goals;
``--rate none`` runs the closed-loop cell of issue 23 (completions, 64/64 tokens, concurrency 8,
640 prompts). 6 rounds. One JSON document on stdout.

    python benchmarks/serve_overhead.py                 # the goal's cell, ~30 min on 2 cores
    python benchmarks/serve_overhead.py --concurrency 1 8 --profile --plain-check
    python benchmarks/serve_overhead.py --sides vllm,ray_serve_llm,ray_defaults
    python benchmarks/serve_overhead.py --gpu           # H200 etc.: benchmarks/serve/gpu.py
    python benchmarks/serve_overhead.py --sides vllm,ray_serve_llm,ray_openai_app  # our builder
                                                        # vs Ray's; or --builder ray

``--profile`` adds one py-spy pass per side (benchmarks/serve/profile.py) and writes the
per-request / per-token budget; ``--replica-direct`` adds the Ray replica's own port as a side
(past HAProxy). Not a test: run it when the machine is quiet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.serve import cpu, load, matched, passes, profile, servers, stats  # noqa: E402
from benchmarks.serve.servers import BARE, DIRECT, SELF_CHECK, SHIPPED  # noqa: E402
from infra.plan import serve_tuning  # noqa: E402
from workloads.serve import local  # noqa: E402
from workloads.serve.cpu_profile import to_cpu  # noqa: E402
from workloads.serve.tiny_model import build_tiny_model  # noqa: E402

DEFAULT_ROUNDS = 6  # even: each side as often early in a round as late


def log(msg: str) -> None:
    print(f"[serve-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


PROMPTS_PER_STREAM, MIN_PROMPTS, MAX_PROMPTS = 80, 160, 1280


def prompts_for(concurrency: int, prompts: int | None) -> int:
    """640 at concurrency 8 (the goal's cell), 160 at 1: passes of ~20 s on 2 cores. At 160
    prompts a c8 pass lasted ~5 s and bare vs bare spanned 0.57-1.65x tokens/s over 5 rounds;
    at 640, 0.77-1.39x (benchmarks/README.md)."""
    return prompts or max(MIN_PROMPTS, min(MAX_PROMPTS, PROMPTS_PER_STREAM * concurrency))


def parse(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sides", default=f"{BARE},{SHIPPED}", help=f"comma-separated; {BARE} always runs"
    )
    parser.add_argument("--replica-direct", action="store_true", help=f"add the {DIRECT} side")
    parser.add_argument(
        "--builder",
        choices=sorted(servers.BUILDERS),
        default="park",
        help="the app builder of the as-shipped Ray sides: park (workloads/serve/app.py, the "
        f"LLMServer as ingress) or ray (build_openai_app); side {servers.RAYS_APP}: always Ray's",
    )
    parser.add_argument(
        "--no-self-check", action="store_true", help=f"skip the {SELF_CHECK} side (no verdicts)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[stats.GOAL_CONCURRENCY])
    parser.add_argument("--endpoints", nargs="+", default=[stats.GOAL_ENDPOINT])
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=None, help="default: prompts_for()")
    parser.add_argument("--warmups", type=int, default=8, help="vLLM's, in every pass")
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved passes per side (even)"
    )
    parser.add_argument("--profile", action="store_true", help="+1 py-spy pass per side")
    parser.add_argument(
        "--plain-check", action="store_true", help="+1 plain `vllm_bench` process per side"
    )
    parser.add_argument("--pin", action="store_true", help="Ray's processes off the model core")
    parser.add_argument("--ray-env", action="append", default=[], metavar="K=V")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs here")
    parser.add_argument("--gpu", action="store_true", help="CUDA vLLM: benchmarks/serve/gpu.py")
    parser.add_argument("--gpu-model", default="Qwen/Qwen3-8B", help="--gpu: catalogued shape")
    parser.add_argument(
        "--rate",
        default="probe",
        help="matched offered load, requests/s for every side; 'probe' (default): "
        f"{matched.PROBE_FRACTION}x the slower side's closed-loop rate in a probe pass per side; "
        "'none': closed loop at --concurrency (issue 23's cell)",
    )
    parser.add_argument(
        "--pass-seconds", type=float, default=matched.PASS_SECONDS, help="matched: per pass"
    )
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: at least 2 (a spread needs two rounds)")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.rate not in ("probe", "none"):
        try:
            args.rate = float(args.rate)
        except ValueError:
            parser.error(f"--rate {args.rate!r}: a number of requests/s, 'probe' or 'none'")
    return args


def cell_key(endpoint: str, c: int, rate: float | None) -> str:
    """``completions/c8`` (closed loop) or ``completions/rate9.5`` (matched, c only a ceiling)."""
    return f"{endpoint}/rate{rate:g}" if rate else f"{endpoint}/c{c}"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM like Ctrl-C: the servers' context managers stop them


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    args = parse(argv)
    if args.gpu:
        from benchmarks.serve import gpu

        return gpu.main(args)
    model = str(build_tiny_model())
    known = servers.variants(dict(kv.split("=", 1) for kv in args.ray_env), args.builder)
    shipped = known[SHIPPED]
    assert shipped.config is not None
    served = local.served_models(shipped.config)[0]
    cpu_config, _ = to_cpu(shipped.config, model, direct_streaming=False)
    engine_kwargs = cpu_config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
    return run(args, model, served, engine_kwargs, known, sides_of(args))


def sides_of(args: argparse.Namespace) -> list[str]:
    """The sides in pass order: the bare server first (every ratio is against it), the rest,
    and the self-check (the bare server again) last unless ``--no-self-check``. With the order
    reversed every other round, the two bare sides take mirrored places (first and last, then
    last and first) and bracket the others: the self-check compares two places alike."""
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.replica_direct and DIRECT not in sides:
        sides.append(DIRECT)
    rest = [s for s in sides if s not in (BARE, SELF_CHECK)]
    return [BARE, *rest, *([] if args.no_self_check else [SELF_CHECK])]


def run(
    args: argparse.Namespace,
    model: str,
    served: str,
    engine_kwargs: dict[str, Any],
    known: dict[str, servers.Variant],
    sides: list[str],
) -> int:
    unknown = [s for s in sides if s not in known]
    if unknown:
        raise SystemExit(f"unknown sides {unknown}; known: {', '.join(known)}")
    started, load_at_start = time.time(), [round(x, 2) for x in os.getloadavg()]
    cells = [(e, c) for c in args.concurrency for e in args.endpoints]
    probe: dict[str, Any] = {}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    budgets: dict[str, dict[str, Any]] = {}
    plain: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        work = Path(tmp)
        flags = servers.engine_flags(engine_kwargs)
        b = Bench(
            args, known, model, served, flags, work, passes.Run(f"{os.getpid()}-{int(started)}")
        )
        if args.rate == "probe":
            probe = probed_rate(b, [s for s in sides if s != SELF_CHECK])
            b.rate = probe["rate"]
        elif args.rate != "none":
            b.rate = float(args.rate)
        if b.rate:
            cells = [(e, max(args.concurrency)) for e in args.endpoints]
        for r, round_sides in enumerate(passes.order(sides, args.rounds)):
            for side in round_sides:
                with b.alone(side, f"round{r}") as server:
                    for endpoint, c in cells:
                        t = b.measured(server, endpoint, c)
                        key = cell_key(endpoint, c, b.rate)
                        results.setdefault(side, {}).setdefault(key, []).append(t)
                        log(
                            f"round {r} {side} {endpoint} c={c}: {t['output_tokens_per_s']} "
                            f"tok/s, TTFT {t['ttft_ms']['mean']} ms, TPOT {t['tpot_ms']['mean']} "
                            f"ms, other jobs {t['other_jobs_cpu_s']} CPU-s, load "
                            f"{t['load_average_1m']}"
                        )
        once = [s for s in sides if s != SELF_CHECK]  # the same server as BARE
        if args.plain_check:
            for side in once:
                with b.alone(side, "plain") as server:
                    plain[side] = plain_check(b, server, results)
        if args.profile:
            for side in once:
                with b.alone(side, "profile") as server:
                    for endpoint, c in cells:
                        budgets[f"{side}/{endpoint}/c{c}"] = profiled(b, server, endpoint, c)
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for f in work.rglob("*"):
                if f.is_file():
                    dest = args.keep_logs / f.relative_to(work)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(f.read_bytes())
    report = build_report(
        args, served, engine_kwargs, known, sides, cells, results, b.passes, rate=b.rate
    )
    report["matched_load"] = matched_report(args, sides, cells, results, b.rate, probe)
    report.update(
        plain_client_check=plain,
        profiles=budgets,
        wall_s=round(time.time() - started, 1),
        machine=machine(load_at_start),
    )
    for line in headline(report):
        log(line)
    print(json.dumps(report, indent=2, default=_plain))
    return 0


@dataclass
class Bench:
    """What every pass needs: the options, the sides, the model, the run's id (``passes``)."""

    args: argparse.Namespace
    known: dict[str, servers.Variant]
    model: str
    served: str
    engine_flags: list[str]
    work: Path
    run: passes.Run
    passes: list[dict[str, Any]] = field(default_factory=list)  # one record per server started
    rate: float | None = None  # matched offered load (requests/s), None: closed loop

    def start(self, side: str, tag: str) -> contextlib.AbstractContextManager[servers.Server]:
        v = self.known[side]
        return servers.started(v, self.model, self.served, self.engine_flags, self.work, tag)

    @contextlib.contextmanager
    def alone(self, side: str, label: str) -> Iterator[servers.Server]:
        """``side``'s server, fresh, for one pass, with nothing else of the run alive."""
        log(f"{label}: starting {side}")
        with passes.alone(self.run, side, label, self.start) as server:
            record: dict[str, Any] = {
                "pass": label,
                "side": side,
                "startup_s": round(server.startup_s, 1),
                **server.settle,
                "nice": cpu.niceness(server.sid),
                "rss_gib": round(
                    sum(p.memory_info().rss for p in cpu.session(server.sid) if p.is_running())
                    / 2**30,
                    2,
                ),
            }
            if self.args.pin and self.known[side].config is not None:
                record["pinned"] = cpu.pin(server.sid)
            self.passes.append(record)
            log(
                f"{side} up in {server.startup_s:.0f}s, settled in {record['settle_s']}s "
                f"(idle {record['idle_cpu_s_per_s']} CPU-s/s) at {server.base_url}"
            )
            yield server

    def argv(self, server: servers.Server, endpoint: str, c: int) -> list[str]:
        a = self.args
        return load.client_argv(
            server.base_url,
            self.model,
            self.served,
            endpoint=endpoint,
            concurrency=c,
            prompts=(
                a.prompts or matched.prompts_at(self.rate, a.pass_seconds)
                if self.rate
                else prompts_for(c, a.prompts)
            ),
            input_len=a.input_len,
            output_len=a.output_len,
            warmups=a.warmups,
            seed=a.seed,
            request_rate=self.rate,
        )

    def measured(self, server: servers.Server, endpoint: str, c: int) -> dict[str, Any]:
        def alone(when: str) -> None:
            self.run.check_alone(server.tag, when)

        return load.trial(server.sid, self.argv(server, endpoint, c), alone)


def probed_rate(b: Bench, sides: list[str]) -> dict[str, Any]:
    """The offered rate for the matched rounds: one short closed-loop pass per side (each alone,
    fresh, at the first --concurrency, 160 prompts) and ``matched.rate_from_probe`` of the
    slower side's requests/s."""
    e, c = b.args.endpoints[0], max(b.args.concurrency)
    capacity: dict[str, float] = {}
    for side in sides:
        with b.alone(side, "probe") as server:
            argv = load.client_argv(
                server.base_url, b.model, b.served, endpoint=e, concurrency=c, prompts=160,
                input_len=b.args.input_len, output_len=b.args.output_len,
                warmups=b.args.warmups, seed=b.args.seed,
            )  # fmt: skip
            t = load.trial(server.sid, argv, lambda when: b.run.check_alone(server.tag, when))
            capacity[side] = t["requests_per_s"]
            log(f"probe {side}: {capacity[side]} requests/s closed-loop at c={c}")
    rate = matched.rate_from_probe(capacity, matched.PROBE_FRACTION)
    log(f"matched offered load: {rate} requests/s for every side")
    return {"closed_loop_requests_per_s": capacity, "concurrency": c, "rate": rate}


def matched_report(
    args: argparse.Namespace,
    sides: list[str],
    cells: list[tuple[str, int]],
    results: dict[str, dict[str, list[dict[str, Any]]]],
    rate: float | None,
    probe: dict[str, Any],
) -> dict[str, Any]:
    """Issue 39's figures: every side against the bare server at the same offered rate, each
    figure with a paired sign test over the rounds, and the goals' verdicts."""
    if not rate:
        return {"ran": False, "why": "--rate none: closed loop only"}
    out: dict[str, Any] = {
        "ran": True,
        "offered_requests_per_s": rate,
        "how": "probe" if probe else "given (--rate)",
        "probe": probe,
        "arrivals": f"Poisson, seed {args.seed}: the same schedule for every side",
        "pass_seconds": args.pass_seconds,
        "concurrency_ceiling": max(args.concurrency),
        "control_plane_groups": list(matched.CONTROL_PLANE),
        "frontend_groups": list(matched.FRONTEND),
        "goals_rule": (
            f"met / missed when the sign test of the per-round values against the goal decides "
            f"at p < {matched.ALPHA} or the whole min-max spread lies on one side; else undecided"
        ),
        "cells": {},
    }
    for endpoint, c in cells:
        key = cell_key(endpoint, c, rate)
        bare = results.get(BARE, {}).get(key)
        if not bare:
            continue
        out["cells"][key] = {
            s: matched.compare(results[s][key], bare, hosts=1, accelerator=args.gpu)
            for s in sides
            if s != BARE and key in results.get(s, {})
        }
    return out


def plain_check(
    b: Bench, server: servers.Server, results: dict[str, dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """The goal's cell once more, by the plain client in a process of its own (benchmarks/
    README.md's command): inside the in-process trials' min-max, or not."""
    import subprocess

    name = f"plain-{server.side}.json"
    c, e = stats.GOAL_CONCURRENCY, stats.GOAL_ENDPOINT
    argv = b.argv(server, e, c)
    cmd = [sys.executable, "-m", "benchmarks.serve.vllm_bench", *argv, "--save-result"]
    cmd += ["--result-dir", str(b.work), "--result-filename", name]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    got = json.loads((b.work / name).read_text())
    trials = results.get(server.side, {}).get(f"{e}/c{c}", [])
    out: dict[str, Any] = {"command": ["python", "-m", "benchmarks.serve.vllm_bench", *argv]}
    for figure, key in (
        ("output_tokens_per_s", "output_throughput"),
        ("mean_ttft_ms", "mean_ttft_ms"),
    ):
        values = [stats.FIGURES[figure](t) for t in trials]
        value = round(float(got[key]), 2)
        out[figure] = {
            "plain": value,
            "trials_min_max": [min(values), max(values)] if values else None,
            "within": bool(values) and min(values) <= value <= max(values),
        }
    return out


def profiled(b: Bench, server: servers.Server, endpoint: str, c: int) -> dict[str, Any]:
    """One more pass under py-spy; the per-request and per-token budget of its processes."""
    threads = profile.thread_cpu(server.sid)
    folder = b.work / "profiles" / f"{server.side}-{endpoint}-c{c}"
    with profile.recording(server.sid, folder) as got:
        t = b.measured(server, endpoint, c)
    after = profile.thread_cpu(server.sid)
    delta = {k: v - threads.get(k, 0.0) for k, v in after.items()}
    requests = t["completed"] + b.args.warmups + 1  # + vLLM's ready check
    out = profile.budget(got(), delta, requests, b.args.output_len)
    out["trial"] = {k: t[k] for k in ("output_tokens_per_s", "ttft_ms", "tpot_ms")}
    return out


def build_report(
    args: argparse.Namespace,
    served: str,
    engine_kwargs: dict[str, Any],
    known: dict[str, servers.Variant],
    sides: list[str],
    cells: list[tuple[str, int]],
    results: dict[str, dict[str, list[dict[str, Any]]]],
    started: list[dict[str, Any]],
    rate: float | None = None,
) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for endpoint, c in cells:
        key = cell_key(endpoint, c, rate)
        row: dict[str, Any] = {
            s: stats.summary(results[s][key]) for s in sides if key in results.get(s, {})
        }
        bare = results.get(BARE, {}).get(key)
        if bare:
            again = results.get(SELF_CHECK, {}).get(key)
            check = stats.self_check(again, bare) if again else {"reliable": False, "ran": False}
            row["self_check"] = check
            others = [s for s in sides if s not in (BARE, SELF_CHECK) and key in results.get(s, {})]
            row["ratio"] = {s: stats.ratios(results[s][key], bare) for s in others}
            row["verdicts"] = {s: stats.compare(results[s][key], bare, s, check) for s in others}
            row["cpu_outside_engine"] = {
                s: stats.outside_engine(results[s][key], bare, args.output_len) for s in others
            }
        table[key] = row
    shipped = known[SHIPPED]
    example = load.client_argv("http://127.0.0.1:PORT", "MODEL_DIR", served)
    goal_cell = table.get(f"{stats.GOAL_ENDPOINT}/c{stats.GOAL_CONCURRENCY}")
    checked = [goal_cell] if goal_cell else list(table.values())
    return {
        "benchmark": "benchmarks/serve_overhead.py (benchmarks/serve/)",
        "command": ["python", "benchmarks/serve_overhead.py", *(args.argv or [])],
        "client": "vllm bench serve (vllm.benchmarks.serve.main_async, in process)",
        "plain_client_argv": example,
        "isolation": (
            "each pass alone: its side's server started afresh, settled, measured with vLLM's "
            "own warm-ups, stopped with every process of it gone before the next pass starts; "
            "checked before the start, after the settle, at the main run's start and end, and "
            "after the stop (no process of another pass of the run alive)"
        ),
        "reliable": bool(checked) and all(c.get("self_check", {}).get("reliable") for c in checked),
        "model": "tiny-llama (local, random weights, 2 layers)",
        "served_model_name": served,
        "engine_kwargs": engine_kwargs,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "warmups": args.warmups,
        "prompts": {f"c{c}": prompts_for(c, args.prompts) for c in args.concurrency},
        "rounds": args.rounds,
        "order": passes.order(sides, args.rounds),
        "sides": {s: {"note": known[s].note, "env": known[s].env} for s in sides},
        "ray_side": {
            "llm_config_options": serve_tuning.llm_config_options(),
            "deployment_options": serve_tuning.deployment_options(),
            "app_args": serve_tuning.app_args(),
            "ray_env": shipped.env,
            "import_path": [a["import_path"] for a in (shipped.config or {})["applications"]],
        },
        "passes": started,
        "cells": table,
        "goals": {s: stats.goals(table, s) for s in sides if s not in (BARE, SELF_CHECK)},
    }


def headline(report: dict[str, Any]) -> list[str]:
    """The lines a reader wants first: the self-check, the verdicts, the CPU outside the engine."""
    lines = [f"run {'reliable' if report['reliable'] else 'UNRELIABLE (self-check)'}"]
    for key, row in report["cells"].items():
        check = row.get("self_check", {})
        lines.append(f"{key} self-check: {check.get('verdict', 'not run')}")
        for side, figures in row.get("verdicts", {}).items():
            for figure, v in figures.items():
                ratio = row["ratio"][side][figure]["paired"]
                lines.append(
                    f"{key} {side} {figure}: {v[side]['median']} vs {v[BARE]['median']}, per-round "
                    f"ratio {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}): "
                    f"{v['verdict']}"
                )
        for side, o in row.get("cpu_outside_engine", {}).items():
            e = o["extra_ms_per_request"]
            lines.append(
                f"{key} {side} CPU outside the engine: +{e['median']} ms per request "
                f"({e['min']}-{e['max']}), control plane {o['control_plane_cores']['median']} cores"
            )
    lines += [g.get("verdict", g.get("why", "")) for g in report["goals"].values()]
    for key, by_side in report.get("matched_load", {}).get("cells", {}).items():
        for side, m in by_side.items():
            for goal, g in m["goals"].items():
                lines.append(
                    f"{key} {side} {goal} {g['goal']}: {g['median']} ({g['min']}-{g['max']}), "
                    f"sign test {g['sign_test']['wins']}/{g['sign_test']['n']} meet, "
                    f"p {g['sign_test']['p']}: {g['verdict']}"
                )
    return lines


def machine(load_at_start: list[float]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def _plain(value: Any) -> Any:
    """numpy scalars (vLLM's metrics) as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {value!r}")
