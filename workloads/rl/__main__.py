"""``python -m workloads.rl [--config FILE] [--flag value ...]``: the RL RayJob's entrypoint."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from workloads.rl.config import ConfigError, parse_args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except ConfigError as err:
        print(f"workloads.rl: {err}", file=sys.stderr)
        return 2
    from workloads.rl.launcher import run  # imports Ray and torch: after the flags are valid

    try:
        summary = run(cfg)
    except ConfigError as err:
        print(f"workloads.rl: {err}", file=sys.stderr)
        return 2
    return 0 if summary["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
