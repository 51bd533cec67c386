"""Bare vLLM vs Ray Serve LLM, as a client sees it: ``benchmarks/serve/`` (see its ``cli``
module and benchmarks/README.md). ``python benchmarks/serve_overhead.py --help``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.serve.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
