"""``python -m workloads.train [--config FILE] [--flag value ...]``: the RayJob's entrypoint."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from workloads.flags import run_main
from workloads.train.config_check import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("workloads.train", argv, parse_args, "workloads.train.launcher")


if __name__ == "__main__":
    sys.exit(main())
