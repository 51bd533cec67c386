"""benchmarks/serve/matched.py: the sign test, the goals' verdicts and the matched-load
accounting (pure functions, no server)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.serve import cli, load, matched  # noqa: E402


def _binom_two_sided(n: int, k: int) -> float:
    """By hand: the probability of an outcome no likelier than k out of n (p = 1/2)."""
    pk = math.comb(n, k) / 2**n
    return min(
        1.0,
        sum(
            math.comb(n, i) / 2**n
            for i in range(n + 1)
            if math.comb(n, i) / 2**n <= pk * (1 + 1e-9)
        ),
    )


@pytest.mark.parametrize("n", [0, 1, 2, 5, 6, 7, 10, 13])
def test_sign_test_is_the_exact_two_sided_binomial(n: int) -> None:
    for k in range(n + 1):
        expected = _binom_two_sided(n, k) if n else 1.0
        assert matched.sign_test(n, k) == pytest.approx(expected, abs=1e-12)
    try:
        from scipy.stats import binomtest
    except ImportError:
        return
    for k in range(n + 1) if n else []:
        assert matched.sign_test(n, k) == pytest.approx(binomtest(k, n, 0.5).pvalue, abs=1e-12)


def test_sign_test_known_values() -> None:
    assert matched.sign_test(6, 6) == pytest.approx(2 / 64)  # 6 of 6 decides at 0.05
    assert matched.sign_test(5, 5) == pytest.approx(2 / 32)  # 5 of 5 does not
    assert matched.sign_test(6, 5) == pytest.approx(14 / 64)
    assert matched.sign_test(4, 2) == 1.0
    with pytest.raises(ValueError):
        matched.sign_test(3, 4)


def test_paired_drops_ties_and_counts_rounds_where_the_side_is_higher() -> None:
    got = matched.paired([2, 2, 2, 2, 2, 2, 1], [1, 1, 1, 1, 1, 1, 1])
    assert (got["n"], got["wins"], got["ties"]) == (6, 6, 1)
    assert got["p"] == pytest.approx(0.0312, abs=1e-4) and "higher" in got["says"]
    assert "no decision" in matched.paired([2, 0, 2, 0], [1, 1, 1, 1])["says"]


def test_goal_verdicts_met_missed_undecided() -> None:
    # every round meets: met (the sign test decides with 6 rounds, the spread with fewer)
    assert matched.verdict([1.0] * 6, 1.15, at_most=True)["verdict"] == matched.MET
    assert matched.verdict([1.0, 1.1], 1.15, at_most=True)["verdict"] == matched.MET
    assert matched.verdict([1.2, 1.3], 1.15, at_most=True)["verdict"] == matched.MISSED
    # 7 of 8 rounds miss: the sign test decides (p = 0.07 > 0.05: no) -> straddles: undecided
    assert matched.verdict([1.2] * 7 + [1.0], 1.15, at_most=True)["verdict"] == matched.UNDECIDED
    # 9 of 10 miss: p = 0.021: missed although the spread straddles the goal
    v = matched.verdict([1.2] * 9 + [1.0], 1.15, at_most=True)
    assert v["verdict"] == matched.MISSED and v["sign_test"]["wins"] == 1
    assert matched.verdict([0.98, 0.99, 0.96], 0.97, at_most=False)["verdict"] == matched.UNDECIDED


def _trial(
    tokens_s: float, ttft: float, frontend: float, control_cores: float, n: int = 320
) -> dict[str, Any]:
    """A matched pass as load.trial records it (per output token in ms, cores per group)."""
    return {
        "completed": n,
        "output_tokens": 64 * n,
        "output_tokens_per_s": tokens_s,
        "requests_per_s": tokens_s / 64,
        "ttft_ms": {"mean": ttft, "p50": ttft, "p90": 2 * ttft, "p99": 3 * ttft},
        "tpot_ms": {"mean": 3.0, "p50": 3.0, "p90": 4.0, "p99": 5.0},
        "server_cpu_ms_per_output_token": {
            "frontend_x": 0.0,
            "api_server": frontend,
            "engine_core": 1.0,
        }
        if control_cores == 0
        else {"llm_server_replica": frontend, "engine_core": 1.0, "haproxy": 0.05},
        "cores_by_group": {
            "serve_controller": control_cores / 2,
            "gcs": control_cores / 2,
            "haproxy": 0.3,
        },
    }


def test_matched_compare_reads_cpu_per_token_at_the_same_rate_and_control_plane_in_cores() -> None:
    bare = [_trial(600, 30, 0.20, 0.0) for _ in range(6)]
    ray = [_trial(600, 40, 0.22, 0.08) for _ in range(6)]
    got = matched.compare(ray, bare)
    fig = got["figures"]
    assert fig["frontend_cpu_ms_per_output_token"]["ratio"]["median"] == pytest.approx(1.1)
    assert (
        fig["p50_ttft_ms"]["sign_test"]["wins"] == 6 and fig["p50_ttft_ms"]["sign_test"]["p"] < 0.05
    )
    # HAProxy carries requests: per token on the request path, not in the control plane's cores
    assert fig["control_plane_cores"]["side"]["median"] == pytest.approx(0.08)
    assert fig["ray_request_path_cpu_ms_per_output_token"]["side"]["median"] == pytest.approx(0.05)
    goals = got["goals"]
    assert goals["frontend_cpu_per_output_token"]["verdict"] == matched.MET
    assert goals["control_plane_cores_per_host"]["verdict"] == matched.MET
    assert goals["p50_ttft"]["applies"] is False and "not judged" in goals["p50_ttft"]["verdict"]
    assert got["matched"]["matched"] is True
    # the same trials on an accelerator: +10 ms p50 TTFT in every round misses the +3 ms goal
    assert (
        matched.compare(ray, bare, accelerator=True)["goals"]["p50_ttft"]["verdict"]
        == matched.MISSED
    )
    # a control plane over 0.1 core per host in every round misses; over two hosts it meets
    heavy = [_trial(600, 40, 0.22, 0.15) for _ in range(6)]
    assert (
        matched.compare(heavy, bare)["goals"]["control_plane_cores_per_host"]["verdict"]
        == matched.MISSED
    )
    assert (
        matched.compare(heavy, bare, hosts=2)["goals"]["control_plane_cores_per_host"]["verdict"]
        == matched.MET
    )


def test_unmatched_load_is_flagged() -> None:
    bare = [_trial(600, 30, 0.2, 0.0)] * 2
    slow = [_trial(500, 30, 0.2, 0.05, n=300)] * 2
    got = matched.matched_load(slow, bare)
    assert got["matched"] is False and got["same_requests_and_tokens"] is False


def test_rate_from_probe_is_below_the_slower_side_and_prompts_fill_the_pass() -> None:
    assert matched.rate_from_probe({"vllm": 25.0, "ray_serve_llm": 18.0}, 0.6) == pytest.approx(
        10.8
    )
    assert matched.rate_from_probe({"a": 0.05}) == 0.1
    with pytest.raises(ValueError):
        matched.rate_from_probe({"a": 0.0})
    assert matched.prompts_at(10.8, 30) == 324 and matched.prompts_at(0.1, 30) == 32


def test_matched_argv_offers_the_rate_and_asks_for_p90() -> None:
    argv = load.client_argv("http://h:1", "M", "s", request_rate=10.8, prompts=324)
    assert argv[argv.index("--request-rate") + 1] == "10.8"
    assert argv[argv.index("--metric-percentiles") + 1] == "50,90,99"
    assert "--request-rate" not in load.client_argv("http://h:1", "M", "s")
    assert cli.cell_key("completions", 8, 10.8) == "completions/rate10.8"
    assert cli.cell_key("completions", 8, None) == "completions/c8"
    assert cli.parse(["--rate", "7.5"]).rate == 7.5 and cli.parse([]).rate == "probe"
    with pytest.raises(SystemExit):
        cli.parse(["--rate", "fast"])


def test_gpu_sides_run_the_same_executor() -> None:
    """Ray Serve LLM runs vLLM with Ray's executor on a GPU (it refuses any other): the bare
    server's flags carry the same, so the GPU ratio holds no executor difference."""
    from benchmarks.serve import gpu, servers

    assert gpu.ENGINE_KWARGS["distributed_executor_backend"] == "ray"
    flags = servers.engine_flags(gpu.ENGINE_KWARGS)
    assert flags[flags.index("--distributed-executor-backend") + 1] == "ray"
