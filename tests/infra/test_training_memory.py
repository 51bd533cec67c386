"""The training run against its chips' memory at preview: the plan's micro-batch, the rule that
refuses a run that cannot fit (naming the keys, with what would fit), the trainer flag the
plan renders, the warning for a model whose facts are unknown, the fit table.

The references: the estimator itself (infra.resolve.training_fit, proven against PyTorch's own
accounting in test_training_fit_torch.py) asked directly with the same settings, the
trainer's own parser and rules (workloads/train/config.py), and the catalog's slices. The
must-hold cases of issue 19 (DDP of an 8B model and FSDP2 of a 32B model on 8 v6e chips) are
refused by their bytes: 16 B of states per parameter alone exceed a chip.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import shlex

import pytest
from typer.testing import CliRunner

from infra import catalog, model_lookup
from infra.plan import ray as ray_plan
from infra.resolve import resolve
from infra.resolve.training_fit import GIB, estimate
from infra.rules import training_memory, workloads
from infra.schema.read import parse_values, read_stack_file
from infra.stack import from_values
from infra.tools import report
from infra.tools.cli import app
from tests.conftest import STACKS_DIR
from tests.infra.stack_problems import problems_of
from workloads.train.config import LOSS_CHUNK_TOKENS
from workloads.train.config_check import parse_args

FIT_KEYS = (
    "park:training.model",
    "park:training.strategy",
    "park:training.seqLen",
    "park:training.microBatchSize",
    "park:training.activationCheckpointing",
    "park:training.pool",
)


def _stack(name: str = "dev", **training) -> dict:
    """A shipped stack with training keys changed (and serving off, so only training speaks)."""
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{name}.yaml")
    values = copy.deepcopy(values)
    values["park:training"] = {**values["park:training"], **training}
    values["park:serving"] = {"enabled": False}
    return values


def _set(values: dict, key: str, value: object) -> None:
    """Set a stack key such as park:training.seqLen or park:tpuPools[0].topology."""
    match = re.fullmatch(r"(park:\w+)(?:\[(\d+)\])?\.(\w+)", key)
    assert match, key
    section = values[match.group(1)]
    if match.group(2) is not None:
        section = section[int(match.group(2))]
    if value is None:
        section.pop(match.group(3), None)
    else:
        section[match.group(3)] = value


def _direct(plan, micro_batch: int, **settings):
    """The estimator asked directly with the plan's settings (and `settings` changed)."""
    training = plan.training
    spec, tpu = training.spec, training.pool.slice
    strategy = settings.get("strategy", spec.strategy)
    share = spec.global_batch_size // training.workers
    return estimate(
        training.facts.facts,
        strategy=strategy,
        world_size=training.workers,
        shard_size=tpu.chips if strategy == "fsdp2" else 1,
        micro_batch=micro_batch,
        accumulation_steps=share // micro_batch,
        seq_len=settings.get("seq_len", spec.seq_len),
        activation_checkpointing=settings.get(
            "activation_checkpointing", spec.activation_checkpointing
        ),
        usable_bytes=tpu.generation.runtime_hbm_bytes_per_device,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
    )


# ---- the shipped stacks fit, at the largest micro-batch that does ---------------------------


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_shipped_runs_fit_at_the_largest_micro_batch_that_does(stack):
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    plan = from_values(values, stack)
    training = plan.training
    fit = training.fit
    assert fit is not None and fit.fits
    share = training.spec.global_batch_size // training.workers
    assert training.micro_batch * training.accumulation_steps == share
    assert (fit.micro_batch, fit.accumulation_steps) == (
        training.micro_batch,
        training.accumulation_steps,
    )
    assert fit.usable_bytes == catalog.GENERATIONS["v6e"].runtime_hbm_bytes_per_device
    assert fit.total_bytes == _direct(plan, training.micro_batch).total_bytes
    larger = [m for m in range(training.micro_batch + 1, share + 1) if share % m == 0]
    assert not any(_direct(plan, m).fits for m in larger)
    assert not [w for w in plan.warnings if w.key.startswith("park:training")]


def test_the_plan_s_micro_batch_reaches_the_trainer_as_it_parses_it():
    plan = from_values(_stack(microBatchSize=1), "dev")
    assert (plan.training.micro_batch, plan.training.accumulation_steps) == (1, 4)
    rayjob = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))
    parsed = parse_args(shlex.split(rayjob["spec"]["entrypoint"])[3:])
    assert parsed.micro_batch_size == 1
    unpinned = from_values(_stack(), "dev")
    fields = ray_plan.trainer_flags(unpinned.training)
    assert fields["micro_batch_size"] == unpinned.training.micro_batch


# ---- refused at preview: the must-hold cases, by their bytes ---------------------------------


@pytest.mark.parametrize(
    ("model", "strategy"),
    [("Qwen/Qwen3-8B", "ddp"), ("Qwen/Qwen3-32B", "fsdp2")],
)
def test_a_run_that_cannot_fit_8_v6e_chips_is_refused_for_memory(model, strategy):
    facts = model_lookup.lookup(model).facts
    assert facts is not None and facts.params is not None
    shard = 8 if strategy == "fsdp2" else 1
    # fp32 weights, gradients and AdamW's two moments alone exceed what a v6e chip reports
    assert facts.params * 16 / shard > catalog.GENERATIONS["v6e"].runtime_hbm_bytes_per_device
    problems = problems_of(_stack(model=model, strategy=strategy))
    message = problems["park:training.model"]
    assert "memory" in message
    for key in FIT_KEYS[1:]:
        assert key in message, key
    needs = float(re.search(r"needs ([0-9.]+) GiB per chip", message).group(1))
    assert needs > 31.25
    assert "31.25 GiB" in message


def _refused_plan(values: dict):
    """The plan of a stack the rules refuse (resolved partially, as the rules see it)."""
    return resolve(parse_values(values, "dev"), partial=True)


@pytest.mark.parametrize(
    "training",
    [
        {"model": "Qwen/Qwen3-8B", "strategy": "ddp"},
        # a bigger slice that 8 sequences do not split over: the batch it would need is named
        {"model": "Qwen/Qwen3-32B", "globalBatchSize": 8, "activationCheckpointing": True},
    ],
)
def test_what_would_fit_does_fit(training):
    """The refused run's figure is the estimator's at micro-batch 1, and every change the
    message proposes, applied to the stack, passes preview with the fit it promised."""
    values = _stack(**training)
    message = problems_of(values)["park:training.model"]
    plan = _refused_plan(values)
    assert f"needs {_direct(plan, 1).total_bytes / GIB:.1f} GiB per chip" in message
    proposals = training_memory.alternatives(plan.training)
    assert proposals, message
    for proposal in proposals:
        assert str(proposal) in message
        fixed = copy.deepcopy(values)
        for key, value in proposal.changes.items():
            _set(fixed, key, value)
        accepted = from_values(fixed, "dev").training
        assert accepted.fit is not None and accepted.fit.fits
        assert accepted.fit.total_bytes == proposal.fit.total_bytes


@pytest.mark.parametrize(
    ("training", "key"),
    [
        ({"model": "Qwen/Qwen3-8B", "strategy": "ddp"}, "park:training.strategy"),
        ({"model": "Qwen/Qwen3-32B"}, "park:tpuPools[0].topology"),
        (
            {"seqLen": 32768, "activationCheckpointing": False},
            "park:training.activationCheckpointing",
        ),
    ],
)
def test_the_proposals_name_the_change_that_fits(training, key):
    values = _stack(**training)
    message = problems_of(values)["park:training.model"]
    assert "would fit: " in message and key in message.split("would fit:")[1]


def test_a_pinned_micro_batch_that_does_not_divide_the_chip_s_share_is_refused():
    problems = problems_of(_stack(microBatchSize=3))  # 32 sequences / 8 chips = 4 each
    assert list(problems) == ["park:training.microBatchSize"]
    assert "1, 2, 4" in problems["park:training.microBatchSize"]


def test_a_pinned_micro_batch_that_does_not_fit_is_refused_under_its_key():
    """Find, with the estimator, a seqLen where the whole share does not fit but one sequence
    does: pinning the whole share there is refused under microBatchSize, naming the one that
    fits."""
    plan = from_values(_stack(activationCheckpointing=False), "dev")
    share = plan.training.spec.global_batch_size // plan.training.workers
    seq_len = next(
        s
        for s in (1024, 2048, 4096, 8192, 16384)
        if not _direct(plan, share, seq_len=s).fits and _direct(plan, 1, seq_len=s).fits
    )
    problems = problems_of(
        _stack(microBatchSize=share, seqLen=seq_len, activationCheckpointing=False)
    )
    message = problems["park:training.microBatchSize"]
    assert "does not fit" in message and "pinned" in message
    assert "park:training.microBatchSize " in message.split("would fit:")[1]


# ---- facts: looked up once, unknown is a warning ---------------------------------------------


def test_the_rules_read_the_facts_the_plan_holds():
    """The training rules ask the plan's facts, not the network or the catalogue again: facts
    of an MoE model put on the plan of a dense one are refused as the trainer would."""
    plan = from_values(_stack(), "dev")
    moe = model_lookup.lookup("Qwen/Qwen3-30B-A3B")
    assert moe.facts is not None and moe.facts.moe
    swapped = dataclasses.replace(plan, training=dataclasses.replace(plan.training, facts=moe))
    problems = {p.key: p.message for p in workloads.check_training(swapped)}
    assert "park:training.model" in problems
    assert "Qwen3-1.7B" not in problems["park:training.model"]


def test_an_unknown_model_offline_is_a_warning_not_a_refusal():
    plan = from_values(_stack(model="someone/new-model"), "dev")
    assert plan.training.fit is None
    (warning,) = [w for w in plan.warnings if w.key == "park:training.model"]
    assert "no model facts here" in warning.message and "catalogue.yaml" in warning.message
    share = plan.training.spec.global_batch_size // plan.training.workers
    assert (plan.training.micro_batch, plan.training.accumulation_steps) == (share, 1)


def test_a_gpt_preset_is_a_warning_naming_its_key():
    plan = from_values(_stack(model=None, objective="clm", data="synthetic", modelSize="1b"), "dev")
    (warning,) = [w for w in plan.warnings if w.key == "park:training.modelSize"]
    assert "memory check" in warning.message
    table = report.training_fit_table(plan)
    assert table is not None and table.row_count == 1


# ---- the table ------------------------------------------------------------------------------


def test_validate_prints_the_training_fit(tmp_path):
    result = CliRunner().invoke(
        app, ["validate", "dev", "--no-serve-check"], catch_exceptions=False, terminal_width=200
    )
    assert result.exit_code == 0, result.output
    plan = from_values(read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")[0], "dev")
    fit = plan.training.fit
    assert "training fit: Qwen/Qwen3-1.7B, fsdp2 on 8 chips" in result.output
    for label in ("parameters", "gradients", "optimizer", "activations", "logits", "reserve"):
        assert re.search(rf"{label}\s*│\s*[0-9.]+\s*│", result.output), label
    assert re.search(rf"total\s*│\s*{fit.total_bytes / GIB:.2f}\s*│ fits in 31.25", result.output)
    assert f"micro-batch {fit.micro_batch} x {fit.accumulation_steps} accumulation" in result.output
