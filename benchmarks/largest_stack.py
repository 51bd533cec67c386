"""How long the largest stack park accepts takes to validate, render and price (issue 30).

The stack is tests/infra/test_hostile_values.py's `_largest()`: every list at its stated
maximum (32 TPU pools holding 512 slices, 16 GPU pools, 16 served models, 100 authorized
networks) and the training numbers that drive work at their bounds. Printed as JSON: seconds
for resolve + rules (what `park validate` checks first), `park cost`'s estimate, and the
render under Pulumi mocks, with the resources it registers. Not a test: timings on a shared
machine are noisy; the test only holds that each ends.

    python benchmarks/largest_stack.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from infra.stack import from_values
    from infra.tools.cost import estimate
    from infra.tools.render import run_program
    from tests.infra.test_hostile_values import _largest

    values = _largest()
    started = time.perf_counter()
    plan = from_values(values, "big")
    planned = time.perf_counter()
    estimate(plan)
    priced = time.perf_counter()
    rendered = run_program(values, "big", plan=plan)
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "tpu_slices": sum(p.slices for p in plan.tpu_pools),
                "resources": len(rendered.resources),
                "plan_s": round(planned - started, 3),
                "cost_s": round(priced - planned, 3),
                "render_s": round(done - priced, 3),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
