"""benchmarks/serve: the parts that decide what is reported (no server is started here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.serve import load, profile, stats  # noqa: E402


def _trial(tok_s: float, ttft: float) -> dict[str, Any]:
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
        "server_cpu_ms_per_request": {"engine_core": 10.0},
        "cpu_ms_per_request_by_role": {"engine": 10.0},
        "other_jobs_cpu_s": 0.0,
        "idle_servers_cpu_s": 0.0,
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
    assert (args.max_concurrency, args.num_prompts, args.num_warmups) == (8, 160, 8)
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


def test_goal_is_judged_on_the_median_paired_ratio() -> None:
    bare = [_trial(1000, 40)] * 3
    cells = {"completions/c8": {"ratio": {"ray": stats.ratios([_trial(950, 50)] * 3, bare)}}}
    verdict = stats.goals(cells, "ray")
    assert verdict["throughput"]["holds"] and verdict["mean_ttft"]["holds"]
    cells = {"completions/c8": {"ratio": {"ray": stats.ratios([_trial(850, 70)] * 3, bare)}}}
    verdict = stats.goals(cells, "ray")
    assert not verdict["throughput"]["holds"] and not verdict["mean_ttft"]["holds"]
    assert not stats.goals({}, "ray")["evaluated"]


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
