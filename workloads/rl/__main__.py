"""``python -m workloads.rl [--config FILE] [--flag value ...]``: the RL RayJob's entrypoint."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from workloads.flags import run_main
from workloads.rl.config_check import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("workloads.rl", argv, parse_args, "workloads.rl.launcher")


if __name__ == "__main__":
    sys.exit(main())
