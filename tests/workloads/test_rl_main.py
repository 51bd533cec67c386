"""``python -m workloads.rl``: a flag the workload refuses exits 2 naming it, before Ray or torch
are imported (the RayJob fails fast with the reason in its log)."""

from __future__ import annotations

import subprocess
import sys


def test_refused_flags_exit_2_before_ray() -> None:
    code = (
        "import sys; from workloads.rl.__main__ import main; "
        "rc = main(['--model', 'park:tiny-llama', '--data', 'p.jsonl', '--group-size', '1']); "
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'imported too early'; "
        "sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "--group-size must be >= 2" in done.stderr
