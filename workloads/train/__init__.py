"""Language-model training on Ray Train: TPU (torch_tpu), GPU or CPU; DDP or FSDP2 (HSDP across
slices); Hugging Face causal LMs (pretrained or from a config) or the GPT presets.

Modules, in the order a run uses them: ``config`` (flags, validation) → ``scaling`` (Ray's
ScalingConfig / TorchConfig) and ``tpu_bridge`` (torch_tpu's slice environment, reconciled
with the KubeRay TPU webhook's) → ``launcher`` (TorchTrainer) → on each worker ``loop`` with
``modeling`` (``hf`` for Hugging Face models, ``tiny_llama`` for ``park:tiny-llama``, ``model``
for the GPT presets), ``step`` (micro-batches, gradient accumulation) and ``loss`` (the chunked
cross-entropy), ``strategies``, ``data`` and ``text`` (``facts`` for ``park:facts``),
``checkpointing``, ``metrics`` and ``export``; ``storage`` reads and writes local paths and
buckets. ``generate`` is the greedy reference for an export. Entrypoint:
``python -m workloads.train --help``.
"""
