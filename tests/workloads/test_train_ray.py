"""The training workload on a real local Ray cluster (2 CPU workers, gloo).

The session's Ray head serves every test here (train_fixtures.ray_head: one start of ~15 s on
2 cores for every module that needs Ray).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from infra.tools.local.profile import TRAIN_CPU_PROFILE
from tests.workloads.train_fixtures import LocalRay, local_ray  # noqa: F401  (fixture)
from workloads.train.config import TrainConfig
from workloads.train.config_check import resolve
from workloads.train.launcher import build_trainer

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

# park local's training profile, as its table says (a tiny Llama from a config learning the
# shipped facts, supervised fine-tuning, 2 CPU workers): here with DDP (park local keeps the
# stack's strategy) and each step's batch in one pass (micro-batches: test_train_step).
PARK_LOCAL: dict[str, Any] = {
    field: value
    for field, (value, _why) in TRAIN_CPU_PROFILE.items()
    if value is not None and field not in ("micro_batch_size", "storage_path")
} | {"strategy": "ddp"}


def _config(storage: Path, run_name: str, **overrides: Any) -> TrainConfig:
    run = dict(seq_len=64, steps=20, checkpoint_every=10, report_every=5, run_name=run_name)
    values = PARK_LOCAL | run | {"storage_path": str(storage)} | overrides
    return resolve(TrainConfig.from_dict(values), ray.cluster_resources())


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(
        int(p.name.split("_")[1])
        for p in run_dir.glob("checkpoint_*")
        if (p / "train_state.json").exists()
    )


def _expected_data_state(cfg: TrainConfig, rank: int, steps: int) -> dict[str, Any]:
    """Where rank ``rank``'s data stream stands after ``steps`` batches, replayed here."""
    from transformers import AutoTokenizer

    from workloads.train.inputs import facts, text
    from workloads.train.models import tiny_llama

    batches = text.TextBatches(
        text.plan_units(str(facts.facts_path())),
        text.Encoder(AutoTokenizer.from_pretrained(tiny_llama.build()), objective=cfg.objective),
        seq_len=int(cfg.seq_len or 0),
        batch_size=cfg.batch // cfg.workers,
        seed=cfg.seed,
        rank=rank,
        world_size=cfg.workers,
        split_documents=cfg.objective == "clm",
        pad_id=0,
    )
    for _ in range(steps):
        batches.next_batch()
    return {"step": steps} | batches.state_dict()


def _data_states(checkpoint: Path) -> list[dict[str, Any]]:
    return [
        json.loads((checkpoint / "data_state" / f"rank-{r:05d}.json").read_text()) for r in (0, 1)
    ]


@pytest.mark.parametrize(("strategy", "micro"), [("ddp", 2), ("fsdp2", None)])
def test_hf_model_trains_checkpoints_and_resumes_its_data(
    local_ray: LocalRay,
    tmp_path: Path,
    strategy: str,
    micro: int | None,
) -> None:
    """DDP accumulates two micro-batches per step: the data still advances a batch a step."""
    cfg = _config(
        tmp_path, f"resume-{strategy}", strategy=strategy, export=False, micro_batch_size=micro
    )
    first = build_trainer(cfg).fit()

    assert first.error is None
    assert first.metrics["step"] == 20
    assert first.metrics["resumes"] == 0
    losses = {m["step"]: m["loss"] for _, m in first.best_checkpoints}
    assert sorted(losses) == [10, 20]
    ln_vocab = math.log(715)
    assert losses[20] < losses[10] < ln_vocab
    assert first.checkpoint is not None
    shards = {p.name for p in Path(first.checkpoint.path).iterdir()}
    assert {".metadata", "train_state.json", "__0_0.distcp", "__1_0.distcp"} <= shards
    assert _data_states(Path(first.checkpoint.path)) == [
        _expected_data_state(cfg, r, 20) for r in (0, 1)
    ]

    longer = _config(
        tmp_path, f"resume-{strategy}", strategy=strategy, steps=30, micro_batch_size=micro
    )
    second = build_trainer(longer).fit()

    assert second.error is None
    assert second.metrics["resumed_from_step"] == 20
    assert second.metrics["resumes"] == 1
    assert second.metrics["step"] == 30
    assert second.metrics["loss"] < losses[20]
    assert _checkpoint_steps(Path(second.path)) == [20, 30]  # keep_checkpoints=2
    # The data continued where it stopped: after 30 batches, not 20 + a restart's 10.
    assert second.checkpoint is not None
    assert _data_states(Path(second.checkpoint.path)) == [
        _expected_data_state(cfg, r, 30) for r in (0, 1)
    ]
    export = Path(second.metrics["export_path"])
    assert export == tmp_path / f"resume-{strategy}" / "export" / "final"
    assert (export / "config.json").exists() and (export / "model.safetensors").exists()


def test_fsdp2_shards_hold_the_weights_ddp_replicates(local_ray: LocalRay, tmp_path: Path) -> None:
    """Random init from a config is the same weights whatever the layout: gathered FSDP2 shards
    (2 ranks, uneven rows) equal DDP's replicas, on every rank."""
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from workloads.train.distributed.scaling import build_scaling_config, build_torch_config

    cfg = _config(tmp_path, "init")

    def compare(config: dict[str, Any]) -> None:
        import tempfile

        import torch
        from torch.distributed.tensor import DTensor

        from workloads.train.distributed.strategies import build_mesh
        from workloads.train.models import modeling

        run = TrainConfig.from_dict(config)
        mesh = build_mesh("cpu", 2)
        weights = {}
        for strategy in ("ddp", "fsdp2"):
            model = modeling.build(
                replace(run, strategy=strategy),
                device=torch.device("cpu"),
                mesh=mesh,
                dtype=torch.float32,
                restoring=False,
            )
            weights[strategy] = {
                k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                for k, v in model.inner.state_dict().items()
            }
        same = all(torch.equal(weights["ddp"][k], weights["fsdp2"][k]) for k in weights["ddp"])
        uneven = any(v.shape[0] % 2 for v in weights["ddp"].values())
        with tempfile.TemporaryDirectory() as directory:
            rank = ray.train.get_context().get_world_rank()
            Path(directory, f"rank{rank}.json").write_text(json.dumps([same, uneven]))
            ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(directory))

    result = TorchTrainer(
        compare,
        train_loop_config=cfg.to_dict(),
        torch_config=build_torch_config(cfg),
        scaling_config=build_scaling_config(cfg),
        run_config=RunConfig(name="init", storage_path=str(tmp_path)),
    ).fit()
    assert result.error is None and result.checkpoint is not None
    for rank in (0, 1):
        same, uneven = json.loads((Path(result.checkpoint.path) / f"rank{rank}.json").read_text())
        assert same and uneven


def _registered_checkpoints(run_dir: Path) -> list[int]:
    """Steps of the checkpoints Ray Train has registered (its snapshot names them)."""
    try:
        text = (run_dir / "checkpoint_manager_snapshot.json").read_text()
    except OSError:
        return []
    return sorted({int(step) for step in re.findall(r"checkpoint_(\d{8})", text)})


def _kill_a_worker_after_first_checkpoint(
    dashboard_url: str, run_dir: Path, seen: dict[str, Any]
) -> None:
    """Wait for a registered checkpoint, then SIGKILL one training worker (as a preemption)."""
    from ray.util.state import list_actors

    try:
        deadline = time.time() + 240
        while time.time() < deadline and not _registered_checkpoints(run_dir):
            time.sleep(0.05)
        # The cluster's address, explicitly: other Ray clusters may run on this machine.
        workers = list_actors(
            address=dashboard_url,
            detail=True,
            filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")],
        )
        seen["checkpoint_at_kill"] = max(_registered_checkpoints(run_dir), default=0)
        victim = max(workers, key=lambda a: a.pid)
        os.kill(victim.pid, signal.SIGKILL)
        seen["killed_pid"] = victim.pid
    except Exception as err:  # reported by the test's assertion
        seen["error"] = repr(err)


def test_recovers_from_a_killed_worker(local_ray: LocalRay, tmp_path: Path) -> None:
    run = dict(steps=80, seq_len=128, global_batch_size=16, checkpoint_every=10, report_every=10)
    # the facts as plain text, packed
    cfg = _config(tmp_path, "fault", objective="clm", max_failures=2, export=False, **run)
    seen: dict[str, Any] = {}
    killer = threading.Thread(
        target=_kill_a_worker_after_first_checkpoint,
        args=(local_ray.dashboard_url, tmp_path / "fault", seen),
    )
    killer.start()
    result = build_trainer(cfg).fit()
    killer.join()

    assert "killed_pid" in seen, f"no worker was killed: {seen}"
    assert result.error is None
    assert result.metrics["step"] == 80
    assert result.metrics["resumes"] == 1
    resumed = result.metrics["resumed_from_step"]
    # Restarted from the newest checkpoint at the time of the kill (or a later one), so at most
    # one checkpoint interval of steps was lost.
    assert resumed >= seen["checkpoint_at_kill"] >= 10
    assert resumed % 10 == 0


def test_tpu_bridge_sets_env_before_process_group(local_ray: LocalRay) -> None:
    """The bridge's Ray hook, run with gloo: every worker finds itself in the address list."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from workloads.train.distributed.tpu_bridge import ADDRESSES, TorchTPUConfig

    def check_env() -> None:
        """Each worker writes what it saw into the run's checkpoint (Ray keeps those)."""
        import json
        import tempfile

        import torch.distributed as dist

        context = ray.train.get_context()
        seen = {
            "rank": int(os.environ["RANK"]),
            "local_rank": context.get_local_rank(),
            "ip": ray.util.get_node_ip_address(),
            "group_up": dist.is_initialized(),
            "addresses": os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","),
            "topology": os.environ["TORCH_TPU_TOPOLOGY"],
            "visible": os.environ.get("TPU_VISIBLE_DEVICES"),
            "defer_and_fuse": os.environ.get("TORCH_TPU_DEFER_AND_FUSE"),
        }
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, f"rank{seen['rank']}.json").write_text(json.dumps(seen))
            ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def fit(webhook_env: dict[str, str]) -> list[dict[str, Any]]:
        trainer = TorchTrainer(
            check_env,
            torch_config=TorchTPUConfig(backend="gloo", torch_tpu_topology="2,1,1"),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="bridge",
                storage_path=str(local_ray.temp_dir / "bridge"),
                worker_runtime_env={"env_vars": webhook_env},  # as the webhook injects it
            ),
        )
        result = trainer.fit()
        assert result.error is None and result.checkpoint is not None
        return [
            json.loads((Path(result.checkpoint.path) / f"rank{r}.json").read_text()) for r in (0, 1)
        ]

    for worker in fit({}):  # no webhook: the bridge's own plan; one host, so localhost
        assert worker["addresses"] == ["localhost:8070", "localhost:8071"]
        assert worker["addresses"][worker["rank"]] == f"localhost:{8070 + worker['local_rank']}"
        assert worker["topology"] == "2,1,1"
        assert worker["visible"] is None  # no chip on a CPU worker
        assert worker["defer_and_fuse"] == "1"  # Google's sample's setting, by default
        assert worker["group_up"]
    injected = {"TORCH_TPU_TOPOLOGY": "2,1,1", ADDRESSES: "localhost:8471,localhost:8472"}
    for worker in fit(injected):  # the webhook's list works for these ranks: used as injected
        assert worker["addresses"] == ["localhost:8471", "localhost:8472"]
    # A disagreeing topology is refused in test_train_tpu.py, not here: Ray 2.60 keeps the
    # workers of a group whose backend setup raised (they hold this cluster's CPUs until it
    # stops), which would starve the next test.
