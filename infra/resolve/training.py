"""How the resolve step sizes a training run: the facts of the model it trains, and one chip's
share of a step at the micro-batch that fits (infra.resolve.training_fit), on the catalog's slice.

The plan (infra.resolve), the training rules' "what would fit" answers and the RL learner
(infra.resolve.rl) all size a run through fit_training, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra import catalog, model_facts, model_lookup
from infra.model_facts import FactsLookup
from infra.resolve import training_fit
from infra.resolve.training_fit import TrainingFit
from infra.schema.models import TrainingConfig
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
    (infra.resolve.training_fit counts the parameters from the shapes then)."""
    return facts.params is not None or bool(facts.intermediate_size)


def fit_training(
    facts: model_facts.ModelFacts,
    spec: TrainingConfig,
    tpu: catalog.TpuSlice,
    slices: int,
    **overrides: object,
) -> TrainingFit | None:
    """One chip's share of a step of `spec` on `slices` slices of `tpu` at the pinned
    micro-batch, or at the most sequences that fit (infra.resolve.training_fit.best_micro_batch).
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
    workers = tpu.devices * slices  # one Ray Train worker per runtime device
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
        shard_size=tpu.devices if settings["strategy"] == "fsdp2" else 1,
        usable_bytes=tpu.generation.runtime_hbm_bytes_per_device,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        **settings,
    )


@dataclass(frozen=True)
class RunLimits:
    """A run's RayJob bounds, derived once, and what follows from them for whoever waits on
    the run (a serving replica waiting for its export).

    KubeRay 1.7 fails a RayJob past activeDeadlineSeconds counted from its start, and retries
    a failed one `backoffLimit` times on a new cluster, each retry with a fresh start time,
    never one that failed by its deadline (ray-operator/controllers/ray/rayjob_controller.go:
    checkActiveDeadlineAndUpdateStatusIfNeeded, checkBackoffLimitAndUpdateStatusIfNeeded, and
    initRayJobStatusIfNeed setting StartTime again after Retrying)."""

    # How long the trainer waits for its staged model (--model-wait-s); None: not staged.
    model_wait_s: int | None
    # activeDeadlineSeconds: the stack's run budget plus that wait, which the trainer spends
    # inside the job and which must not eat the budget.
    active_deadline_s: int
    # backoffLimit: the stack's, as it is. With the wait, a start race no longer fails a run;
    # what is left either repeats on a new cluster (a deterministic error) or is a lost host,
    # which Ray Train's max_failures recovers inside the cluster. Retries stay the user's call.
    backoff_limit: int

    @property
    def export_within_s(self) -> int:
        """From the RayJob's creation, the time by which its export exists or never will:
        the staging wait before a first start, then every attempt to its deadline. A queued
        pool's wait for admission (Kueue) comes on top and is not bounded here."""
        return (self.model_wait_s or 0) + (self.backoff_limit + 1) * self.active_deadline_s


def run_limits(active_deadline_s: int, backoff_limit: int, model_wait_s: int | None) -> RunLimits:
    """A run's limits from its stack section's budget and retries and its model's wait."""
    return RunLimits(
        model_wait_s=model_wait_s,
        active_deadline_s=active_deadline_s + (model_wait_s or 0),
        backoff_limit=backoff_limit,
    )


def micro_batches(fit: TrainingFit | None, pinned: int | None, share: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) of a rank's `share` of the batch: the fit's when the
    model is sized, else the stack's pin or the whole share in one pass."""
    if fit is not None:
        return fit.micro_batch, fit.accumulation_steps
    micro = pinned or share
    return micro, max(share // max(micro, 1), 1)
