"""Minimal reproductions of what stays in Ray itself, each measured alone.

    python -m benchmarks.serve.repro route PORT    # HAProxy's per-request LLMRouter call
    python -m benchmarks.serve.repro metrics       # one Ray vs prometheus_client observation

``route``: under direct streaming HAProxy's Lua asks the LLMRouter replica where each POST goes
(``POST /internal/route`` on a new connection, ray/serve/_private/ingress_request_router.lua.tmpl;
ray/llm/_internal/serve/core/ingress/router.py:route) before forwarding it: a full Serve HTTP
request into a Python replica, even with one LLM replica. PORT is the router's, from the
``ROUTERS`` table of ``/tmp/haproxy-serve/*/ingress_request_router.lua``.
``metrics``: Serve LLM's ``log_engine_metrics`` records vLLM's stats through Ray's metrics
(vllm/v1/metrics/ray_wrappers.py), one histogram observation per output token (inter-token
latency) among others; the bare server records them with prometheus_client.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable

BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]


def route(port: int, n: int = 200) -> dict[str, float]:
    """Latency of one /internal/route call, as HAProxy makes it (new connection, HTTP/1.0)."""
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 64}).encode()
    latencies = []
    for _ in range(n):
        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("POST", "/internal/route", body=body)
        conn.getresponse().read()
        conn.close()
        latencies.append(1000 * (time.perf_counter() - start))
    latencies.sort()
    return {
        "median_ms": round(statistics.median(latencies), 2),
        "p90_ms": round(latencies[int(0.9 * n)], 2),
    }


def _per_call_us(fn: Callable[[], object], n: int = 50_000) -> float:
    fn()
    start = time.process_time()
    for _ in range(n):
        fn()
    return round(1e6 * (time.process_time() - start) / n, 2)


def metrics() -> dict[str, float]:
    """CPU µs of one histogram observation: Ray's metrics (in an actor) vs prometheus_client."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    def probe() -> dict[str, float]:
        import prometheus_client
        from ray.util import metrics as ray_metrics

        h = ray_metrics.Histogram("repro_itl", boundaries=BOUNDS, tag_keys=("model_name",))
        p = prometheus_client.Histogram("repro_itl", "x", ["model_name"], buckets=BOUNDS)
        child = p.labels(model_name="m")
        return {
            "ray_observe_cpu_us": _per_call_us(lambda: h.observe(0.02, tags={"model_name": "m"})),
            "prometheus_observe_cpu_us": _per_call_us(lambda: child.observe(0.02)),
        }

    try:
        return dict(ray.get(probe.remote()))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "route" and len(sys.argv) > 2:
        print(json.dumps(route(int(sys.argv[2]))))
    elif what == "metrics":
        print(json.dumps(metrics()))
    else:
        sys.exit(__doc__)
