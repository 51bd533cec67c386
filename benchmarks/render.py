"""Render benchmark: is the offline render (`park render`) close to the cost of its imports?

Two questions, answered in one run, printed as JSON:

1. prod vs imports: a cold render of the prod stack (fresh interpreter: import the program, run
   it under Pulumi mocks) against a cold bare import, in another fresh interpreter, of pulumi and
   the provider modules whose resource classes the render instantiates (recorded during the
   render, e.g. pulumi_gcp.container.node_pool). Goal: render <= 1.3 x bare import, i.e. our
   own code and the mock run add little to what the providers cost to import anyway.
2. scaling: a warm render (imports done) of the prod stack with its training pool at 1, 4, 16
   and 64 TPU slices (one GKE node pool per slice). Goal: linear, 64 slices < 3 x 1 slice.
   A diagnostic repeat pauses Python's cyclic GC during each render: most of the growth is
   collections walking the heap the provider modules leave, not the program.

Medians of several runs; interpreter start-up is not counted (times are taken inside the
process). Not a test: timings on a shared machine are noisy, so it reports rather than asserts.

    python benchmarks/render.py [--repeats N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROD = ROOT / "stacks" / "Pulumi.prod.yaml"
PROVIDERS = ("pulumi_gcp", "pulumi_kubernetes")
SLICES = (1, 4, 16, 64)

_RENDER = f"""
import json, sys, time
t0 = time.perf_counter()
import pulumi
used = set()
_init = pulumi.Resource.__init__
def _record(self, *args, **kwargs):
    used.add(type(self).__module__)
    _init(self, *args, **kwargs)
pulumi.Resource.__init__ = _record  # costs nothing measurable; names the classes' modules
from infra.tools.render import render_stack_file
rendered = render_stack_file(__import__("pathlib").Path({str(PROD)!r}), "prod")
t1 = time.perf_counter()
mods = sorted(m for m in used if m.split(".")[0] in {PROVIDERS!r})
print(json.dumps({{"seconds": t1 - t0, "resources": len(rendered.resources), "modules": mods}}))
"""

_IMPORT = """
import importlib, json, sys, time
mods = json.loads(sys.stdin.read())
t0 = time.perf_counter()
import pulumi
for name in mods:
    importlib.import_module(name)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
"""


def _run(code: str, stdin: str = "") -> dict:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from infra.tools.pychild import run_python

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = run_python(code, stdin, check=True, cwd=ROOT, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def prod_vs_imports(repeats: int) -> dict:
    """Cold render of prod vs a cold import of the provider modules it loads (alternating)."""
    renders, imports, modules, resources = [], [], [], 0
    for _ in range(repeats):
        rendered = _run(_RENDER)
        modules, resources = rendered["modules"], rendered["resources"]
        renders.append(rendered["seconds"])
        imports.append(_run(_IMPORT, json.dumps(modules))["seconds"])
    render_s, import_s = statistics.median(renders), statistics.median(imports)
    return {
        "render_s": round(render_s, 3),
        "bare_import_s": round(import_s, 3),
        "ratio": round(render_s / import_s, 3),
        "goal": "ratio <= 1.3",
        "ok": render_s / import_s <= 1.3,
        "resources": resources,
        "provider_modules": modules,
        "runs": {
            "render_s": [round(x, 3) for x in renders],
            "import_s": [round(x, 3) for x in imports],
        },
    }


def scaling(repeats: int, *, gc_off: bool = False) -> dict:
    """Warm renders of prod with 1..64 training slices, in this process.

    `gc_off`: the same with Python's cyclic GC paused during each render, to show how much of
    the per-slice cost is collections scanning the provider modules' large heap.
    """
    sys.path.insert(0, str(ROOT))
    from infra.schema.read import read_stack_file
    from infra.tools.render import run_program

    values, secrets = read_stack_file(PROD)
    run_program(values, "prod", secrets)  # warm up: imports, caches
    out: dict[str, dict] = {}
    for slices in SLICES:
        pools = [dict(p) for p in values["park:tpuPools"]]
        pools[0]["slices"] = slices  # the training pool: one node pool per slice
        variant = {**values, "park:tpuPools": pools}
        times, count = [], 0
        for _ in range(repeats):
            if gc_off:
                gc.disable()
            t0 = time.perf_counter()
            rendered = run_program(variant, "prod", secrets)
            times.append(time.perf_counter() - t0)
            gc.enable()
            count = len(rendered.resources)
        out[str(slices)] = {"render_s": round(statistics.median(times), 4), "resources": count}
    base, top = out[str(SLICES[0])]["render_s"], out[str(SLICES[-1])]["render_s"]
    # least-squares line through (slices, seconds): how much each slice adds
    xs = list(SLICES)
    ys = [out[str(s)]["render_s"] for s in SLICES]
    slope, intercept = statistics.linear_regression(xs, ys)
    fitted = [intercept + slope * x for x in xs]
    ss_res = sum((y - f) ** 2 for y, f in zip(ys, fitted, strict=True))
    ss_tot = sum((y - statistics.fmean(ys)) ** 2 for y in ys) or 1e-12
    return {
        "by_slices": out,
        "ratio_64_to_1": round(top / base, 3),
        "goal": "64 slices < 3 x 1 slice, linear",
        "ok": top / base < 3,
        "seconds_per_slice": round(slope, 5),
        "linear_fit_r2": round(1 - ss_res / ss_tot, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement (median)")
    args = parser.parse_args()
    started = time.perf_counter()
    result = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "repeats": args.repeats,
        "prod_vs_imports": prod_vs_imports(args.repeats),
        "scaling": scaling(args.repeats),
        "scaling_gc_paused_diagnostic": scaling(args.repeats, gc_off=True),
    }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
