"""Language-model training on Ray Train: TPU (torch_tpu), GPU or CPU; DDP or FSDP2 (HSDP across
slices); Hugging Face causal LMs (pretrained or from a config) or the GPT presets.

At the top, what the pods run and the config they share with infra: ``__main__``
(``python -m workloads.train``, the RayJob's entrypoint), ``config_rules`` → ``config`` →
``config_check`` (allowed values → TrainConfig and its flags → validate, parse_args, resolve),
``launcher`` (the driver: TorchTrainer), ``stage`` (``python -m workloads.train.stage``, the
staging Job), ``generate`` (``python -m workloads.train.generate``, the greedy reference for an
export), ``storage`` (local paths and buckets, one interface, for every part) and ``testing``
(small setups for the tests and benchmarks). Grouped by concern below them, in the order a run
uses them: ``distributed/`` (Ray's ScalingConfig, the TorchTPU bridge, DDP / FSDP2, the run's
environment) → on each worker ``run/`` (the loop, the step, metrics) with ``models/`` (the
model, Hugging Face or GPT preset, and its loss) and ``inputs/`` (batches, text data,
``park:facts``) → ``outputs/`` (checkpoints, the export). ``data/`` is a data folder (the
shipped facts corpus), not code. Entrypoint: ``python -m workloads.train --help``.
"""
