"""The training run each worker executes: ``loop`` (restore, step, checkpoint, export, report:
one code path for every device, strategy and model), ``step`` (one optimizer step's forward and
backward passes over micro-batches) and ``metrics`` (throughput, MFU and the ``PARK_METRICS`` /
``PARK_RESULT`` lines the CLI streams)."""
