"""park:rl, the stack side of the GRPO job: resolve, rules, the RayJob, cost.

The numbers are checked against what the project's own references say independently of the
RL code: the TPU catalog (chips per slice), the serving rules (infra.engine: allowed TP and the
engine fit), the training memory model (infra.resolve.training_fit.best_micro_batch), the vendored
KubeRay CRD schemas, the TPU webhook's group rules and the price sheet.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import pytest

from infra import catalog, engine
from infra.names import POOL_LABEL
from infra.plan import ray
from infra.plan.rl import GPU_RESOURCE, rl_rayjob
from infra.resolve import StackPlan, training_fit
from infra.resolve.training_fit import GIB
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from infra.tools.checks import check_manifests
from infra.tools.cost import estimate, load_prices
from infra.tools.manifests import tpu_groups
from infra.tools.schemas import validate_manifests
from tests.conftest import STACKS_DIR
from workloads.rl.config import RL_COMMAND
from workloads.rl.config_check import parse_args
from workloads.train.config import LOSS_CHUNK_TOKENS

KUBERNETES = "1.35.0"


def shipped_values() -> dict[str, Any]:
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.rl.yaml")
    return values


def plan_of(values: dict[str, Any]) -> StackPlan:
    return from_values(values, "rl")


def with_rl(**changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(shipped_values())
    values["park:rl"].update(changes)
    return values


@pytest.fixture(scope="module")
def plan() -> StackPlan:
    return plan_of(shipped_values())


# ---- resolve ----------------------------------------------------------------------------


def test_learner_is_one_worker_per_chip_of_its_slice(plan):
    rl = plan.rl
    assert rl is not None
    pool = next(p for p in plan.spec.tpu_pools if p.name == plan.spec.rl.learner_pool)
    tpu = catalog.lookup(pool.machine_type, pool.topology)
    assert (rl.workers, rl.hosts) == (tpu.chips, tpu.hosts)
    assert rl.batch == plan.spec.rl.prompts_per_step * plan.spec.rl.group_size
    assert rl.batch % rl.workers == 0


def test_learner_fit_is_the_training_fit_of_the_learner_step(plan):
    rl = plan.rl
    spec, tpu = rl.spec, rl.learner.slice
    assert rl.facts.facts is not None
    expected = training_fit.best_micro_batch(
        rl.facts.facts,
        per_chip_batch=rl.batch // rl.workers,
        pinned=spec.micro_batch_size,
        world_size=rl.workers,
        shard_size=tpu.chips,  # fsdp2 over the slice
        usable_bytes=tpu.generation.runtime_hbm_bytes_per_device,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        strategy=spec.strategy,
        seq_len=spec.max_prompt_tokens + spec.max_response_tokens,
        activation_checkpointing=spec.activation_checkpointing,
    )
    assert rl.fit == expected
    assert rl.fit.fits
    assert (rl.micro_batch, rl.accumulation_steps) == (
        expected.micro_batch,
        expected.accumulation_steps,
    )


def test_the_kl_reference_policy_is_in_the_learner_fit(plan):
    """klCoef > 0: the learner holds a frozen fp32 copy, sharded over the slice (FSDP2)."""
    micro = plan.rl.micro_batch
    with_kl = plan_of(with_rl(klCoef=0.04, microBatchSize=micro)).rl
    params = training_fit.shapes(plan.rl.facts.facts).params
    assert params > 1_000_000_000  # Qwen2.5-1.5B
    assert with_kl.fit.params_bytes - plan.rl.fit.params_bytes == params * 4 // plan.rl.workers
    assert with_kl.fit.total_bytes > plan.rl.fit.total_bytes


def test_rollout_engines_fill_the_slice_at_the_smallest_tp_that_fits(plan):
    rollout = plan.rl.rollout
    tpu = rollout.tpu.slice
    facts = plan.rl.facts.facts
    allowed = engine.allowed_tensor_parallel("vllm-torchtpu", tpu, facts)
    assert list(rollout.options) == allowed
    length = plan.spec.rl.max_prompt_tokens + plan.spec.rl.max_response_tokens

    def fit(tp: int) -> engine.Fit:
        return engine.fit_served(facts, tpu, tp, length, {"gpu_memory_utilization": 0.9})

    assert rollout.tensor_parallel in allowed
    assert all(not fit(tp).fits for tp in allowed if tp < rollout.tensor_parallel)
    assert rollout.fit == fit(rollout.tensor_parallel) and rollout.fit.fits
    assert rollout.engines == tpu.chips // rollout.tensor_parallel * rollout.tpu.slices
    assert rollout.max_model_len == length


def test_entrypoint_parses_back_to_the_plan(plan):
    manifest = rl_rayjob(plan.rl, ray.ray_pods(plan))
    words = shlex.split(manifest["spec"]["entrypoint"])
    assert tuple(words[:3]) == RL_COMMAND
    cfg = parse_args(words[3:])
    rl, spec = plan.rl, plan.spec.rl
    assert cfg.num_workers == rl.workers
    assert cfg.tpu_topology == rl.learner.slice.topology
    assert cfg.rollout_engines == rl.rollout.engines
    assert cfg.rollout_tensor_parallel_size == rl.rollout.tensor_parallel
    assert cfg.micro_batch_size == rl.micro_batch
    assert cfg.reward_names == spec.rewards
    assert cfg.weights == spec.reward_weights
    assert (cfg.group_size, cfg.prompts_per_step) == (spec.group_size, spec.prompts_per_step)
    assert cfg.temperature == spec.sampling_temperature
    assert cfg.publish_every == spec.sync_every
    assert cfg.lr == spec.learning_rate
    assert cfg.model == rl.model_path and cfg.model.startswith(plan.spec.storage.mount_path)


# ---- the RayJob -------------------------------------------------------------------------


def _groups(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]


def test_rayjob_has_learner_and_rollout_groups_on_distinct_pools(plan):
    manifest = rl_rayjob(plan.rl, ray.ray_pods(plan))
    groups = _groups(manifest)
    pools = [g["template"]["spec"]["nodeSelector"][POOL_LABEL] for g in groups]
    assert pools == [plan.spec.rl.learner_pool, plan.spec.rl.rollout_pool]
    assert len({g["groupName"] for g in groups}) == 2
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert "google.com/tpu" not in head["containers"][0]["resources"]["limits"]
    for group, pool in zip(groups, (plan.rl.learner, plan.rl.rollout.tpu), strict=True):
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["google.com/tpu"]) == pool.slice.chips_per_host
        assert group["numOfHosts"] == pool.slice.hosts
        assert group["replicas"] <= pool.slices


def test_engines_are_pinned_to_the_rollout_pods(plan):
    """The rollout pods alone advertise ROLLOUT_RESOURCE, quoted for `ray start --resources`
    as KubeRay's own TPU sample quotes `{"TPU": 4}`; the entrypoint makes the engines ask for
    it, one per chip of the engine."""
    import json
    from pathlib import Path

    from infra.plan.rl import ROLLOUT_RESOURCE
    from workloads.rl.parts import engine_options

    # KubeRay's own sample (../shared/reference beside the checkout, where there is one)
    reference = Path(__file__).resolve().parents[3] / "shared" / "reference" / "kuberay-v1.7.0"
    sample = reference / "samples" / "ray-job.tpu-v6e-256-multihost.yaml"
    if sample.exists():  # the reference's form: '"{\"TPU\": 4}"' in YAML
        quoted = sample.read_text().split("resources: '", 1)[1].split("'", 1)[0]
        assert quoted == '"{\\"TPU\\": 4}"'

    def unquote(value: str) -> dict[str, int]:
        assert value.startswith('"') and value.endswith('"')
        return json.loads(value[1:-1].replace('\\"', '"'))

    learner, rollout = _groups(rl_rayjob(plan.rl, ray.ray_pods(plan)))
    assert "resources" not in learner["rayStartParams"]
    chips = plan.rl.rollout.tpu.slice.chips_per_host
    assert unquote(rollout["rayStartParams"]["resources"]) == {ROLLOUT_RESOURCE: chips}
    cfg = parse_args(shlex.split(rl_rayjob(plan.rl, ray.ray_pods(plan))["spec"]["entrypoint"])[3:])
    assert cfg.rollout_resource == ROLLOUT_RESOURCE
    tp = cfg.rollout_tensor_parallel_size
    assert engine_options(cfg, "tpu")["resources"] == {"TPU": tp, ROLLOUT_RESOURCE: tp}


def test_rayjob_is_valid_against_the_crds_the_webhook_rules_and_the_plan(plan):
    manifest = rl_rayjob(plan.rl, ray.ray_pods(plan))
    assert validate_manifests([manifest], KUBERNETES) == []
    for group in _groups(manifest):
        assert tpu_groups.is_tpu_group(group)
        assert tpu_groups.group_problems(group) == []
    assert check_manifests([manifest], plan) == []


def test_validate_catches_hand_edited_rl_flags(plan):
    manifest = rl_rayjob(plan.rl, ray.ray_pods(plan))
    entry = manifest["spec"]["entrypoint"]
    engines = plan.rl.rollout.engines
    more = entry.replace(f"--rollout-engines {engines} ", f"--rollout-engines {engines * 2} ")
    workers = entry.replace(f"--num-workers {plan.rl.workers} ", "--num-workers 4 ")
    for edited, flag in ((more, "--rollout-engines"), (workers, "--num-workers")):
        broken = copy.deepcopy(manifest)
        broken["spec"]["entrypoint"] = edited
        assert edited != entry
        problems = check_manifests([broken], plan)
        assert [p.path for p in problems] == ["spec.entrypoint"]
        assert flag in problems[0].message


def test_the_program_renders_the_rl_rayjob():
    from tests.conftest import render_stack

    rendered = render_stack("rl")
    jobs = [m for m in rendered.manifests() if m["kind"] == "RayJob"]
    assert [j["metadata"]["name"] for j in jobs] == ["park-rl"]
    assert len(_groups(jobs[0])) == 2
    assert validate_manifests(rendered.manifests(), KUBERNETES) == []


def test_a_gpu_rollout_pool_is_accepted_and_rendered():
    values = with_rl(rolloutPool="l4")
    values["park:gpuPools"] = [
        {
            "name": "l4",
            "machineType": "g2-standard-24",
            "acceleratorType": "nvidia-l4",
            "acceleratorCount": 2,
            "nodes": 2,
        }
    ]
    plan = plan_of(values)
    rollout = plan.rl.rollout
    assert rollout.kind == "gpu" and rollout.tensor_parallel in rollout.options
    assert rollout.engines == 2 * 2 // rollout.tensor_parallel
    assert any(w.key == "park:rl.rolloutPool" for w in plan.warnings)
    manifest = rl_rayjob(plan.rl, ray.ray_pods(plan))
    gpu = _groups(manifest)[1]
    assert gpu["template"]["spec"]["nodeSelector"] == {POOL_LABEL: "l4"}
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "2"
    assert validate_manifests([manifest], KUBERNETES) == []
    assert estimate(plan).rl_run is not None


# ---- rules: one refusal each, naming the key --------------------------------------------


def _refused(values: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        plan_of(values)
    return [p.key for p in err.value.problems]


def _queued() -> dict[str, Any]:
    values = copy.deepcopy(shipped_values())
    values["park:tpuPools"][1]["capacity"] = "queued"
    return values


def _training_on_learner_pool() -> dict[str, Any]:
    values = copy.deepcopy(shipped_values())
    values["park:training"] = {"enabled": True, "pool": values["park:rl"]["learnerPool"]}
    return values


def _rollout_of_the_learners_shape() -> dict[str, Any]:
    values = copy.deepcopy(shipped_values())
    learner = next(p for p in values["park:tpuPools"] if p["name"] == "learner-v6e-8")
    values["park:tpuPools"].append({**learner, "name": "rollout-v6e-8"})
    values["park:rl"]["rolloutPool"] = "rollout-v6e-8"
    return values


def _gpu_learner() -> dict[str, Any]:
    values = with_rl(learnerPool="l4")
    values["park:gpuPools"] = [
        {"name": "l4", "machineType": "g2-standard-8", "acceleratorType": "nvidia-l4"}
    ]
    return values


REFUSALS = {
    "learner pool unknown": (with_rl(learnerPool="nope"), "park:rl.learnerPool"),
    "learner pool a GPU pool": (_gpu_learner(), "park:rl.learnerPool"),
    "rollout pool unknown": (with_rl(rolloutPool="nope"), "park:rl.rolloutPool"),
    "rollout pool is the learner's": (
        with_rl(rolloutPool="learner-v6e-8"),
        "park:rl.rolloutPool",
    ),
    "learner pool is training's": (_training_on_learner_pool(), "park:rl.learnerPool"),
    "rollout slices of the learner's shape": (
        _rollout_of_the_learners_shape(),
        "park:rl.rolloutPool",
    ),
    "queued pool": (_queued(), "park:rl.rolloutPool"),
    "group of one": (with_rl(groupSize=1), "park:rl.groupSize"),
    "reward not a name": (with_rl(rewards=["numeric", "not a reward"]), "park:rl.rewards"),
    "reward weights count": (with_rl(rewardWeights=[1.0]), "park:rl.rewardWeights"),
    "batch not a multiple of the chips": (
        with_rl(promptsPerStep=3, groupSize=2),
        "park:rl.promptsPerStep",
    ),
    "data not records": (with_rl(data="/data/notes.txt"), "park:rl.data"),
    "no model": (with_rl(model=""), "park:rl.model"),
    "TP the slice does not allow": (with_rl(tensorParallelSize=3), "park:rl.tensorParallelSize"),
    "longer than the model's positions": (
        with_rl(maxResponseTokens=40000),
        "park:rl.maxResponseTokens",
    ),
    "learner does not fit": (
        with_rl(model="Qwen/Qwen2.5-14B-Instruct", strategy="ddp"),
        "park:rl.model",
    ),
    "engine does not fit": (
        with_rl(model="Qwen/Qwen2.5-14B-Instruct", tensorParallelSize=1),
        "park:rl.tensorParallelSize",
    ),
}


def test_misfit_messages_say_what_is_allowed():
    with pytest.raises(ConfigError) as err:
        plan_of(with_rl(model="Qwen/Qwen2.5-14B-Instruct", tensorParallelSize=1))
    text = str(err.value)
    assert "park:rl.tensorParallelSize = 1" in text and "allowed:" in text
    with pytest.raises(ConfigError) as err:
        plan_of(with_rl(tensorParallelSize=3))
    assert "allowed: 1, 4" in str(err.value)


# ---- cost -------------------------------------------------------------------------------


def test_cost_prices_both_slices_and_one_run(plan):
    cost = estimate(plan)
    assert cost.rl_run is not None
    learner, rollout = cost.rl_run
    sheet = load_prices(plan)
    hours = plan.spec.rl.steps * plan.spec.rl.estimated_step_seconds / 3600
    for run, pool, chips in (
        (learner, plan.rl.learner, plan.rl.workers),
        (rollout, plan.rl.rollout.tpu, plan.rl.rollout.tpu.total_chips),
    ):
        price = sheet.chip_hour(pool.slice.generation.name, pool.capacity)
        assert run.note == pool.name and run.chips == chips
        assert run.cost == pytest.approx(chips * hours * price.value)
    data = cost.as_json()["rl_run"]
    assert data["cost"] == pytest.approx(learner.cost + rollout.cost, abs=1e-5)
    assert {p["name"] for p in cost.as_json()["pools"]} >= {
        plan.spec.rl.learner_pool,
        plan.spec.rl.rollout_pool,
    }


def test_learner_fit_grows_with_the_sequence():
    """The fit reads the stack's lengths: longer completions, more memory per chip."""
    short = plan_of(with_rl(microBatchSize=8)).rl
    longer = plan_of(with_rl(maxResponseTokens=3072, microBatchSize=8)).rl
    assert (short.micro_batch, longer.micro_batch) == (8, 8)
    assert longer.fit.activations_bytes > short.fit.activations_bytes
    assert longer.fit.total_bytes / GIB < longer.fit.usable_bytes / GIB


# ---- serving the RL run's policy (source: rl) -------------------------------------------


def _serving_the_policy() -> dict[str, Any]:
    values = copy.deepcopy(shipped_values())
    values["park:tpuPools"].append(
        {"name": "serve-v6e-4", "machineType": "ct6e-standard-4t", "topology": "2x2"}
    )
    values["park:serving"] = {
        "enabled": True,
        "pool": "serve-v6e-4",
        "models": [{"name": "policy", "source": "rl", "maxModelLen": 4096}],
    }
    return values


def test_source_rl_serves_the_runs_final_policy_through_the_mount():
    plan = plan_of(_serving_the_policy())
    assert plan.serving is not None and plan.rl is not None
    (model,) = plan.serving.models
    assert model.from_training and model.source == plan.rl.export_path
    assert model.base_model == plan.spec.rl.model  # its facts: the model RL started from
    assert model.facts.facts is not None and model.fit is not None and model.fit.fits
    from infra.tools.render import run_program

    values, secrets = _serving_the_policy(), []
    rendered = run_program(values, "rl", secrets)
    assert not check_manifests(rendered.manifests(), rendered.plan)
    mount = plan.spec.storage.mount_path
    expected = plan.rl.export_path.replace(f"gs://{plan.names.bucket}", mount, 1)
    service = next(m for m in rendered.manifests() if m["kind"] == "RayService")
    assert expected in service["spec"]["serveConfigV2"]


def test_source_rl_without_an_rl_run_is_refused():
    values = _serving_the_policy()
    values["park:rl"] = {**values["park:rl"], "enabled": False}
    assert "park:serving.models[0].source" in _refused(values)


# ---- bounded numbers, the off-policy and sync keys -----------------------------------------


BOUNDS = {
    "NaN learning rate": (with_rl(learningRate=float("nan")), "park:rl.learningRate"),
    "infinite KL coefficient": (with_rl(klCoef=float("inf")), "park:rl.klCoef"),
    "infinite reward weight": (
        with_rl(rewards=["numeric", "format"], rewardWeights=[1.0, float("inf")]),
        "park:rl.rewardWeights",
    ),
    "dual-clip not above 1": (with_rl(clipRatioC=1.0), "park:rl.clipRatioC"),
    "importance cap below 1": (with_rl(importanceSamplingCap=0.5), "park:rl.importanceSamplingCap"),
    "a group past the stated maximum": (with_rl(groupSize=65), "park:rl.groupSize"),
    "a batch past the store's bound": (
        with_rl(promptsPerStep=4096, groupSize=8),
        "park:rl.promptsPerStep",
    ),
    "staleness past the steps": (with_rl(maxStaleness=5, steps=4), "park:rl.maxStaleness"),
    "overlap without staleness": (with_rl(maxStaleness=0), "park:rl.maxStaleness"),
    "a template without the prompt": (
        with_rl(promptTemplate="Solve it."),
        "park:rl.promptTemplate",
    ),
    "a reward timeout of zero": (with_rl(rewardTimeoutSeconds=0), "park:rl.rewardTimeoutSeconds"),
    "an unknown correction": (
        with_rl(offPolicyCorrection="sequence"),
        "park:rl.offPolicyCorrection",
    ),
}


@pytest.mark.parametrize(
    ("values", "key"), [*REFUSALS.values(), *BOUNDS.values()], ids=[*REFUSALS, *BOUNDS]
)
def test_rule_refuses_naming_the_key(values, key):
    """Each refusal above, and each unbounded number, names the key that made it."""
    assert key in _refused(values)


def test_synchronous_runs_on_policy_are_accepted():
    synchronous = plan_of(with_rl(overlap=False, maxStaleness=0))
    manifest = rl_rayjob(synchronous.rl, ray.ray_pods(synchronous))
    cfg = parse_args(shlex.split(manifest["spec"]["entrypoint"])[3:])
    assert (cfg.overlap, cfg.max_staleness) == (False, 0)


def test_the_off_policy_and_sync_keys_reach_the_entrypoint(plan):
    spec = plan.spec.rl
    cfg = parse_args(shlex.split(rl_rayjob(plan.rl, ray.ray_pods(plan))["spec"]["entrypoint"])[3:])
    assert cfg.off_policy_correction == spec.off_policy_correction == "token_truncate"
    assert cfg.importance_sampling_cap == spec.importance_sampling_cap == 2.0  # TRL, verl
    assert cfg.clip_ratio_c == spec.clip_ratio_c == 3.0  # verl
    assert cfg.overlap is spec.overlap is True
    assert cfg.weight_sync == spec.weight_sync == "ray"
    assert cfg.reward_timeout_s == spec.reward_timeout_seconds
    # verl examples/data_preprocess/gsm8k.py: question + " " + instruction_following
    assert cfg.prompt_template == (
        '{prompt} Let\'s think step by step and output the final answer after "####".'
    )


def test_the_sync_estimate_counts_the_models_bytes(plan):
    """bf16 once onto each rollout host, against the fp32 folder every TP worker of every engine
    read: the model's parameters from the catalogue's config (the training fit's count)."""
    sync, rollout = plan.rl.sync, plan.rl.rollout
    params = training_fit.shapes(plan.rl.facts.facts).params
    assert 1.5e9 < params < 1.6e9  # Qwen2.5-1.5B: 1.54B (tied embeddings counted once)
    assert sync.bytes_per_step == 2 * params * rollout.hosts
    assert sync.legacy_written == 4 * params
    assert sync.legacy_read == 4 * params * rollout.engines * rollout.tensor_parallel
    # the figures for this stack: 6.2 GB written and 25 GB read per step before
    assert round(sync.legacy_written / 1e9, 1) == 6.2 and round(sync.legacy_read / 1e9) == 25
    assert sync.legacy_bytes_per_step / sync.bytes_per_step >= 4
    assert sync.seconds is not None and sync.seconds > 0  # phases: test_rl_sync_estimate.py


def _eight_b() -> StackPlan:
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.rl-8b.yaml")
    return plan_of(values)


def test_the_8b_stack_fits_both_sides_and_says_so_at_preview():
    from rich.console import Console

    from infra.tools.report_rl import rl_table, sync_line

    plan = _eight_b()
    rl = plan.rl
    assert rl.spec.model == "Qwen/Qwen3-8B" and training_fit.shapes(rl.facts.facts).params > 8e9
    tpu = rl.learner.slice
    expected = training_fit.best_micro_batch(
        rl.facts.facts,
        per_chip_batch=rl.batch // rl.workers,
        pinned=None,
        world_size=rl.workers,
        shard_size=tpu.chips,
        usable_bytes=tpu.generation.runtime_hbm_bytes_per_device,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        strategy="fsdp2",
        seq_len=rl.seq_len,
        activation_checkpointing=True,
    )
    assert rl.fit == expected and rl.fit.fits
    facts = rl.facts.facts
    engine_fit = engine.fit_served(
        facts, rl.rollout.tpu.slice, rl.rollout.tensor_parallel, rl.seq_len,
        {"gpu_memory_utilization": 0.9},
    )  # fmt: skip
    assert rl.rollout.fit == engine_fit and engine_fit.fits
    assert rl.sync.legacy_bytes_per_step / rl.sync.bytes_per_step >= 4
    console = Console(record=True, width=300)
    console.print(rl_table(plan))
    shown = console.export_text()
    assert sync_line(rl.sync).split(";")[0] in shown.replace("\n", " ")
    cost = estimate(plan)
    assert cost.rl_run is not None and cost.as_json()["rl_run"]["cost"] > 0


def test_a_7b_on_the_rl_stack_drops_sync_bytes_at_least_fourfold():
    rl = plan_of(with_rl(model="Qwen/Qwen2.5-7B-Instruct")).rl
    assert rl.fit.fits and rl.rollout.fit.fits
    assert rl.sync.legacy_bytes_per_step / rl.sync.bytes_per_step >= 4
