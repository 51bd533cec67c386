"""Serving benchmark: bare vLLM vs Ray Serve LLM with vLLM's own load generator.

``cli`` (the run), ``servers`` (what is compared), ``passes`` (each side measured alone),
``load`` (``vllm bench serve`` in process), ``cpu`` (CPU by process group), ``stats`` (median and
spread over interleaved rounds, verdicts, the self-check, the CPU outside the engine),
``matched`` (both sides at one offered rate: CPU per output token per process, the control plane
in cores, a paired sign test per figure, issue 39's goals), ``profile`` (py-spy budget), ``gpu``
(the same on a CUDA machine), ``vllm_bench`` (the plain client). Entry point: ``python
benchmarks/serve_overhead.py`` (see benchmarks/README.md).
"""
