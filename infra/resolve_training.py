"""How the resolve step sizes a training run: the facts of the model it trains, and one chip's
share of a step at the micro-batch that fits (infra.training_fit), on the catalog's slice.

The plan (infra.resolve), the training rules' "what would fit" answers and the RL learner
(infra.resolve_rl) all size a run through fit_training, so they agree.
"""

from __future__ import annotations

from infra import catalog, model_facts, model_lookup, training_fit
from infra.model_facts import FactsLookup
from infra.spec.models import TrainingConfig
from infra.training_fit import TrainingFit
from workloads.train.config import LOSS_CHUNK_TOKENS


def training_model_facts(spec: TrainingConfig) -> FactsLookup:
    """The facts of the model a run trains, looked up once for the rules, the fit and the
    reports: a Hugging Face model's as model_lookup finds them; a GPT preset has none here (its
    shapes live in the torch side of the trainer, which infra does not import)."""
    if spec.model:
        return model_lookup.lookup(spec.model)
    return FactsLookup(
        None,
        (),
        f"a GPT preset (park:training.modelSize {spec.model_size}) is defined in the trainer's "
        "torch code, which preview does not import",
    )


def sizable(facts: model_facts.ModelFacts) -> bool:
    """The training fit can size the model: its parameter count is known, or its MLP width
    (infra.training_fit counts the parameters from the shapes then)."""
    return facts.params is not None or bool(facts.intermediate_size)


def fit_training(
    facts: model_facts.ModelFacts,
    spec: TrainingConfig,
    tpu: catalog.TpuSlice,
    slices: int,
    **overrides: object,
) -> TrainingFit | None:
    """One chip's share of a step of `spec` on `slices` slices of `tpu` at the pinned
    micro-batch, or at the most sequences that fit (infra.training_fit.best_micro_batch).
    `overrides` change one setting (strategy, seq_len, activation_checkpointing, micro_batch
    pin) for the rules' "what would fit" answers. None: the batch does not split evenly over
    the chips, or the pin does not divide a chip's share (the rules say so)."""
    settings: dict[str, object] = {
        "strategy": spec.strategy,
        "seq_len": spec.seq_len,
        "activation_checkpointing": spec.activation_checkpointing,
        "pinned": spec.micro_batch_size,
        **overrides,
    }
    workers = tpu.chips * slices
    share, rest = divmod(spec.global_batch_size, workers)
    pinned = settings.pop("pinned")
    if rest or not share or not sizable(facts):
        return None
    if pinned is not None and (not isinstance(pinned, int) or share % pinned):
        return None
    return training_fit.best_micro_batch(
        facts,
        per_chip_batch=share,
        pinned=pinned,
        world_size=workers,
        # FSDP2 shards over one slice's chips; across slices it is HSDP (replicas per slice).
        shard_size=tpu.chips if settings["strategy"] == "fsdp2" else 1,
        usable_bytes=tpu.generation.runtime_hbm_bytes_per_chip,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        **settings,
    )
