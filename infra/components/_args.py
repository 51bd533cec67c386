"""Argument types more than one component takes: a TPU pool's reference (a TpuSlicePool's
output, a workload's and Kueue's input), the training job's settings and the `kubeconfig` every
Kubernetes component takes.

Fields that stand for a stack-spec field say what its docstring says, with its default
(`infra.components._types.spec_doc`; tests/infra/test_package_schema.py holds them to it);
TrainingArgs is written from the stack's training keys (infra/tools/fields.py).
"""

from typing import NotRequired, TypedDict

import pulumi

from infra.components import _types
from infra.components._types import CapacityArg, TpuMachineTypeArg, TpuTopologyArg


class KubeconfigArgs(TypedDict):
    """What every Kubernetes component's arguments start from (a base: its subclasses' schema
    descriptions come from here, park_gke.provider.schema)."""

    kubeconfig: NotRequired[pulumi.Input[str]]
    """A kubeconfig (Cluster.kubeconfig or ExistingCluster.kubeconfig) for a Kubernetes provider
    of its own; unset: the provider in its options (providers={"kubernetes": ...})."""


class CapacityRungArgs(TypedDict):
    """One rung of a TPU pool's capacity ladder: how its nodes are obtained, tried in order."""

    capacity: CapacityArg
    """on-demand, spot, reservation, flex-start or queued."""
    reservation: NotRequired[str]
    """Reservation, block or sub-block path (capacity `reservation` only)."""
    max_run_duration: NotRequired[str]
    """flex-start: longest a node lives, e.g. `86400s`."""


class TpuPoolRefArgs(TypedDict):
    """The TPU pool a workload runs on: TpuSlicePool.pool_ref (in Python, the TpuSlicePool
    itself), or an existing pool's name, machine type and topology."""

    name: str
    """The pool's name: its nodes carry the label park-gke/pool=<name>."""
    machine_type: TpuMachineTypeArg
    """ct6e-standard-1t, -4t or -8t."""
    topology: TpuTopologyArg
    """Slice topology the machine type offers (e.g. 2x4, 4x4)."""
    slices: NotRequired[int]
    """Number of slices (node pools). Default: 1."""
    capacity: NotRequired[CapacityArg]
    """on-demand, spot, reservation, flex-start or queued. Default: on-demand."""
    reservation: NotRequired[str]
    """Reservation name (capacity `reservation` only)."""
    ladder: NotRequired[list[CapacityRungArgs]]
    """Capacity tried in order (instead of `capacity`): one node pool per rung and slice; Kueue
    admits each job on the first rung with room."""


class TrainingArgs(TypedDict):
    """park:training's settings (each a flag of `python -m workloads.train`), typed."""

    # The keys of park:training but enabled, pool and image, as the stack spec declares them.
    # BEGIN generated training-args (python -m infra.tools.fields)
    num_slices: NotRequired[int]
    """Slices to train across (≤ the pool's slices). Default: 1."""
    strategy: NotRequired[_types.StrategyArg]
    """`ddp` or `fsdp2`. Default: fsdp2."""
    model: NotRequired[str]
    """HF causal LM: hub id, `gs://`, a bucket-mount path, `park:tiny-llama`."""
    tokenizer: NotRequired[str]
    """Tokenizer source like `model` (default: the model's)."""
    init: NotRequired[_types.TrainingInitArg]
    """`pretrained` weights or `config` (from scratch); `auto`: by source. Default: auto."""
    model_size: NotRequired[_types.ModelSizeArg]
    """GPT preset when no `model`: tiny, small, gpt2-small/-medium, 1b. Default: gpt2-small."""
    activation_checkpointing: NotRequired[bool]
    """Recompute activations in backward (`model` only). Default: false."""
    steps: NotRequired[int]
    """Optimizer steps in total (a resumed run continues to it). Default: 1000."""
    global_batch_size: NotRequired[int]
    """Sequences per step, a multiple of the workers (chips). Default: 64."""
    micro_batch_size: NotRequired[int]
    """Sequences per chip per pass; unset: the most that fit."""
    seq_len: NotRequired[int]
    """Tokens per sequence (at most the model's context). Default: 1024."""
    learning_rate: NotRequired[float]
    """Peak learning rate (AdamW). Default: 0.0003."""
    warmup_steps: NotRequired[int]
    """Linear warmup steps, then `lrSchedule`. Default: 10."""
    lr_schedule: NotRequired[_types.LrScheduleArg]
    """`cosine`, `linear` (to `minLrRatio`) or `constant`. Default: cosine."""
    min_lr_ratio: NotRequired[float]
    """Final learning rate as a fraction of the peak. Default: 0.1."""
    data: NotRequired[str]
    """`synthetic`, tokens, jsonl/json/parquet/txt, `hf:NAME`, `park:facts`. Default: synthetic."""
    objective: NotRequired[_types.ObjectiveArg]
    """`clm` (packed text) or `sft` (chat template, loss on responses). Default: clm."""
    data_split: NotRequired[str]
    """Split of an `hf:` data set. Default: train."""
    text_field: NotRequired[str]
    """Record field with the text (`clm`). Default: text."""
    messages_field: NotRequired[str]
    """Record field with a chat, `[{role, content}]` (`sft`). Default: messages."""
    prompt_field: NotRequired[str]
    """Prompt field(s) of records without a chat (`sft`). Default: prompt."""
    response_field: NotRequired[str]
    """Response field of records without a chat (`sft`). Default: completion."""
    checkpoint_every: NotRequired[int]
    """Steps between checkpoints (sharded DCP, for resume). Default: 100."""
    keep_checkpoints: NotRequired[int]
    """Checkpoints kept in the bucket. Default: 2."""
    max_failures: NotRequired[int]
    """Restarts from the last checkpoint after a lost worker. Default: 3."""
    export: NotRequired[bool]
    """An HF folder at `.../<run>/export/final` when the run ends. Default: true."""
    export_every: NotRequired[int]
    """Also export at every Nth checkpoint (0: only at the end). Default: 0."""
    export_dtype: NotRequired[_types.ExportDtypeArg]
    """`auto` (bf16 when trained in bf16), `float32`, `bfloat16`. Default: auto."""
    export_max_shard_size: NotRequired[str]
    """Largest safetensors file, e.g. `5GB`; more get an index. Default: 5GB."""
    ttl_seconds_after_finished: NotRequired[int]
    """Keep the finished cluster this long, then free TPUs. Default: 600."""
    active_deadline_seconds: NotRequired[int]
    """Kill the job after this long. Default: 86400."""
    backoff_limit: NotRequired[int]
    """Retries (each a new Ray cluster). Default: 0."""
    estimated_step_seconds: NotRequired[float]
    """Step time used by `park cost` for the run estimate. Default: 1.0."""
    run_id: NotRequired[str]
    """Names the run; a new value re-runs training on the next `up` (new RayJob and folder)."""
    # END generated training-args
