"""Language-model training on Ray Train: TPU (torch_tpu), GPU or CPU; DDP or FSDP2.

Modules, in the order a run uses them: ``config`` (flags, validation) → ``scaling`` (Ray's
ScalingConfig / TorchConfig) and ``tpu_bridge`` (torch_tpu's slice environment) →
``launcher`` (TorchTrainer) → on each worker ``loop`` with ``model``, ``strategies``, ``data``,
``checkpointing`` and ``metrics``. Entrypoint: ``python -m workloads.train --help``.
"""
