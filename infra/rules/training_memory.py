"""Does the training run fit its chips? The memory rule of park:training, on the resolved plan.

The plan holds one chip's share of a step at the chosen micro-batch
(resolve.training.fit_training, resolve.training_fit); this module refuses a run that does
not fit, naming every key that moves the number, and answers what would fit by asking the same
estimator again with one setting changed: a smaller micro-batch, activation checkpointing, FSDP2
instead of DDP, a bigger slice of the same TPU generation (from the catalog), a shorter seqLen.
A model whose facts are not known here is a warning, like a served one's: the check did not run.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra import catalog
from infra.resolve import StackPlan, TrainingPlan
from infra.resolve.training import fit_training, sizable
from infra.resolve.training_fit import GIB, TrainingFit
from infra.schema.errors import ConfigProblem

MIN_SEQ_LEN = 8  # park:training.seqLen's own floor


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def _model_key(training: TrainingPlan) -> tuple[str, str]:
    spec = training.spec
    if spec.model:
        return "park:training.model", spec.model
    return "park:training.modelSize", spec.model_size


def _breakdown(fit: TrainingFit) -> str:
    return (
        f"{_gib(fit.total_bytes)} GiB per chip (parameters {_gib(fit.params_bytes)} + gradients "
        f"{_gib(fit.grads_bytes)} + optimizer {_gib(fit.optimizer_bytes)} + activations "
        f"{_gib(fit.activations_bytes)} + logits {_gib(fit.logits_bytes)} + reserve "
        f"{_gib(fit.reserve_bytes)})"
    )


@dataclass(frozen=True)
class Alternative:
    """A change of the stack that makes the run fit: the keys and values to set, and the fit
    the estimator gives with them (the plan picks the micro-batch unless it is the change)."""

    changes: dict[str, object]  # stack key → value, e.g. {"park:training.strategy": "fsdp2"}
    fit: TrainingFit

    def __str__(self) -> str:
        keys = ", ".join(f"{key} {_yaml(value)}" for key, value in self.changes.items())
        return (
            f"{keys} (micro-batch {self.fit.micro_batch} x {self.fit.accumulation_steps} "
            f"step(s), {_gib(self.fit.total_bytes)} GiB)"
        )


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _fitting(fit: TrainingFit | None) -> TrainingFit | None:
    return fit if fit is not None and fit.fits else None


def bigger_slice(
    training: TrainingPlan, **overrides: object
) -> tuple[catalog.TpuSlice, TrainingFit, int | None] | None:
    """The smallest slice of the pool's TPU generation, larger than the pool's, on which the
    run fits: at the stack's global batch, or, where that does not split over the slice's
    chips, at the next multiple of them (returned as the batch to set; else None)."""
    facts, tpu, spec = training.facts.facts, training.pool.slice, training.spec
    if facts is None:
        return None
    larger = sorted(
        (s for s in catalog.all_slices() if s.generation == tpu.generation and s.chips > tpu.chips),
        key=lambda s: (s.chips, s.hosts, s.machine_type),
    )
    for candidate in larger:
        workers = candidate.devices * training.slices
        batch = None
        if spec.global_batch_size % workers:
            batch = -(-spec.global_batch_size // workers) * workers
        fit = fit_training(
            facts,
            spec.model_copy(update={"global_batch_size": batch}) if batch else spec,
            candidate,
            training.slices,
            **{"pinned": None, **overrides},
        )
        if fit is not None and fit.fits:
            return candidate, fit, batch
    return None


def shorter_seq_len(training: TrainingPlan, **overrides: object) -> TrainingFit | None:
    """The fit at the longest power-of-two seqLen below the stack's that fits."""
    facts, spec = training.facts.facts, training.spec
    if facts is None:
        return None
    seq_len = 1 << (spec.seq_len - 1).bit_length() - 1  # the largest power of two < seqLen
    settings = {"pinned": None, **overrides}
    while seq_len >= MIN_SEQ_LEN:
        fit = fit_training(
            facts, spec, training.pool.slice, training.slices, seq_len=seq_len, **settings
        )
        if fit is not None and fit.fits:
            return fit
        seq_len //= 2
    return None


def _setting_changes(training: TrainingPlan) -> list[tuple[dict[str, object], dict[str, object]]]:
    """(stack keys to set, the estimator's overrides) for each setting that could lower the
    peak: the micro-batch pin dropped (the plan then picks one), activation checkpointing on,
    FSDP2 instead of DDP."""
    spec, key = training.spec, "park:training."
    changes: list[tuple[dict[str, object], dict[str, object]]] = []
    if spec.micro_batch_size is not None:
        changes.append(({key + "microBatchSize": None}, {"pinned": None}))
    if not spec.activation_checkpointing:
        changes.append(
            ({key + "activationCheckpointing": True}, {"activation_checkpointing": True})
        )
    if spec.strategy == "ddp":
        changes.append(({key + "strategy": "fsdp2"}, {"strategy": "fsdp2"}))
    return changes


def _as_is(
    training: TrainingPlan, keys: dict[str, object], overrides: dict[str, object]
) -> Alternative | None:
    """The run with `overrides` applied on its own pool, if it fits."""
    facts = training.facts.facts
    assert facts is not None
    fit = fit_training(
        facts, training.spec, training.pool.slice, training.slices, **{"pinned": None, **overrides}
    )
    return Alternative(_micro(keys, fit), fit) if fit is not None and fit.fits else None


def _moves(
    training: TrainingPlan, keys: dict[str, object], overrides: dict[str, object]
) -> list[Alternative]:
    """With `overrides` applied: the smallest bigger slice, the longest shorter seqLen that fit."""
    found = []
    larger = bigger_slice(training, **overrides)
    if larger is not None:
        candidate, fit, batch = larger
        pool = training.pool.key
        moved: dict[str, object] = {
            f"{pool}.machineType": candidate.machine_type,
            f"{pool}.topology": candidate.topology,
        }
        if batch is not None:
            moved["park:training.globalBatchSize"] = batch
        found.append(Alternative(_micro({**keys, **moved}, fit), fit))
    shorter = shorter_seq_len(training, **overrides)
    if shorter is not None:
        seq = {"park:training.seqLen": shorter.seq_len}
        found.append(Alternative(_micro({**keys, **seq}, shorter), shorter))
    return found


def _micro(keys: dict[str, object], fit: TrainingFit) -> dict[str, object]:
    """A dropped pin reads as the micro-batch the plan would pick."""
    key = "park:training.microBatchSize"
    return {**keys, key: fit.micro_batch} if key in keys else keys


def alternatives(training: TrainingPlan) -> list[Alternative]:
    """What would fit, each with the micro-batch it would run: one setting changed at a time,
    a bigger slice, a shorter seqLen; when none of those fits alone, the settings together
    (with a bigger slice or a shorter seqLen if they still need one)."""
    if training.facts.facts is None:
        return []
    changes = _setting_changes(training)
    found = [alt for keys, overrides in changes if (alt := _as_is(training, keys, overrides))]
    found += _moves(training, {}, {})
    if found or not changes:
        return found
    keys = {k: v for change, _ in changes for k, v in change.items()}
    overrides = {k: v for _, change in changes for k, v in change.items()}
    together = _as_is(training, keys, overrides) if len(changes) > 1 else None
    return [together] if together else _moves(training, keys, overrides)


def fit_problems(plan: StackPlan) -> list[ConfigProblem]:
    """The run's micro-batch pin, and its per-chip memory against what the runtime reports."""
    training = plan.training
    if training is None or training.facts.facts is None or training.facts.facts.moe:
        return []  # unknown: a warning (below); MoE: refused by the model rule
    spec, tpu = training.spec, training.pool.slice
    share, rest = divmod(spec.global_batch_size, training.workers)
    if rest or not share:
        return []  # park:training.globalBatchSize's own problem
    pin = spec.micro_batch_size
    if pin is not None and share % pin:
        return []  # the trainer's own rule refuses it (workloads/train/config.py), by key
    fit = training.fit
    if fit is None or fit.fits:
        return []
    key, name = _model_key(training)
    value: object = name
    micro = "pinned" if pin is not None else "the smallest that divides the chip's share"
    smaller = fit_training(training.facts.facts, spec, tpu, training.slices, pinned=None)
    if pin is not None and _fitting(smaller):
        key, value = "park:training.microBatchSize", pin
    would = alternatives(training)
    answer = (
        f"would fit: {'; '.join(map(str, would))}"
        if would
        else "nothing fits with park:training.microBatchSize, activationCheckpointing and "
        "strategy changed, alone or together, on a larger slice of the catalog or at a "
        f"shorter seqLen (down to {MIN_SEQ_LEN}): train a smaller model"
    )
    return [
        ConfigProblem(
            key,
            value,
            f"does not fit a {tpu.generation.name} chip's memory: {name} under {spec.strategy} "
            f"(park:training.strategy) on {training.workers} chips (park:training.pool "
            f"{training.pool.name}: {training.slices} x {tpu.machine_type} {tpu.topology}), "
            f"{spec.seq_len}-token sequences (park:training.seqLen), micro-batch "
            f"{fit.micro_batch} x {fit.accumulation_steps} step(s) (park:training."
            f"microBatchSize: {micro}), activation checkpointing "
            f"{'on' if spec.activation_checkpointing else 'off'} (park:training."
            f"activationCheckpointing) needs {_breakdown(fit)}, but the runtime gives "
            f"{fit.usable_bytes / GIB:.2f} GiB; {answer}",
        )
    ]


def training_warnings(plan: StackPlan) -> list[ConfigProblem]:
    """A training model whose facts are unknown here: its memory check did not run."""
    training = plan.training
    if training is None:
        return []
    lookup, (key, value) = training.facts, _model_key(training)
    if lookup.error is not None:
        return []  # the model rule refuses it
    if lookup.facts is None:
        why = f"{lookup.reason}; tried {', '.join(lookup.tried) or 'nothing'}"
    elif not sizable(lookup.facts):
        why = f"{lookup.facts.source} gives neither the parameter count nor the MLP width"
    else:
        return []
    hint = (
        "run online (unset HF_HUB_OFFLINE), point model at a folder with config.json and "
        "safetensors, or add the model to infra/data/models/catalogue.yaml"
        if training.spec.model
        else "size the run by hand, or train a Hugging Face model (park:training.model)"
    )
    return [
        ConfigProblem(
            key,
            value,
            f"no model facts here ({why}): the per-chip memory check of the training run did "
            f"not run; {hint}",
        )
    ]
