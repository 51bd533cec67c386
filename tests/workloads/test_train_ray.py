"""The training workload on a real local Ray cluster (2 CPU workers, gloo).

One Ray head serves every test in this module (starting one costs ~15 s on 2 cores).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from tests.workloads.train_fixtures import LocalRay, local_ray  # noqa: F401  (fixture)
from workloads.train.config import TrainConfig, resolve
from workloads.train.launcher import build_trainer
from workloads.train.metrics import parse_line

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

LN_VOCAB = math.log(256)  # the tiny model's loss before training


def _config(storage: Path, run_name: str, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = dict(
        accelerator="cpu",
        num_workers=2,
        model_size="tiny",
        seq_len=64,
        global_batch_size=16,
        lr=1e-2,
        warmup_steps=3,
        steps=20,
        checkpoint_every=10,
        report_every=5,
        storage_path=str(storage),
        run_name=run_name,
        max_failures=0,
    )
    values.update(overrides)
    return resolve(TrainConfig(**values), ray.cluster_resources())


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(
        int(p.name.split("_")[1])
        for p in run_dir.glob("checkpoint_*")
        if (p / "train_state.json").exists()
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_trains_checkpoints_and_resumes(
    local_ray: LocalRay,
    tmp_path: Path,
    strategy: str,
) -> None:
    first = build_trainer(_config(tmp_path, f"resume-{strategy}", strategy=strategy)).fit()

    assert first.error is None
    assert first.metrics["step"] == 20
    assert first.metrics["resumes"] == 0
    losses = {m["step"]: m["loss"] for _, m in first.best_checkpoints}
    assert sorted(losses) == [10, 20]
    assert losses[20] < losses[10] < LN_VOCAB
    assert losses[20] < 0.8 * LN_VOCAB
    assert first.checkpoint is not None
    shards = {p.name for p in Path(first.checkpoint.path).iterdir()}
    assert {".metadata", "train_state.json", "__0_0.distcp", "__1_0.distcp"} <= shards

    second = build_trainer(
        _config(tmp_path, f"resume-{strategy}", strategy=strategy, steps=30)
    ).fit()

    assert second.error is None
    assert second.metrics["resumed_from_step"] == 20
    assert second.metrics["resumes"] == 1
    assert second.metrics["step"] == 30
    assert second.metrics["loss"] < 0.8 * LN_VOCAB
    assert _checkpoint_steps(Path(second.path)) == [20, 30]  # keep_checkpoints=2


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
    cfg = _config(
        tmp_path,
        "fault",
        steps=80,
        seq_len=128,
        global_batch_size=16,
        checkpoint_every=10,
        report_every=10,
        max_failures=2,
    )
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

    from workloads.train.tpu_bridge import TorchTPUConfig

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
        }
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, f"rank{seen['rank']}.json").write_text(json.dumps(seen))
            ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(directory))

    trainer = TorchTrainer(
        check_env,
        torch_config=TorchTPUConfig(backend="gloo", torch_tpu_topology="2,1,1"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="bridge", storage_path=str(local_ray.temp_dir / "bridge")),
    )
    result = trainer.fit()

    assert result.error is None and result.checkpoint is not None
    seen = [
        json.loads((Path(result.checkpoint.path) / f"rank{r}.json").read_text()) for r in (0, 1)
    ]
    ip = seen[0]["ip"]
    for worker in seen:
        assert worker["addresses"] == [f"{ip}:8070", f"{ip}:8071"]
        own = worker["addresses"][worker["rank"] % 2]
        assert own == f"{worker['ip']}:{8070 + worker['local_rank']}"
        assert worker["topology"] == "2,1,1"
        assert worker["visible"] is None  # no chip on a CPU worker
        assert worker["group_up"]


RAYJOB = Path(__file__).resolve().parents[1] / "golden/dev/manifests/rayjob-park-train.yaml"


def test_entrypoint_through_jobs_api(local_ray: LocalRay, tmp_path: Path) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    """The RayJob manifest's entrypoint and runtime env with ``park local``'s CPU profile."""
    from infra.tools.local.profile import TRAIN_CPU_PROFILE, cpu_entrypoint, runtime_env_of

    rayjob = yaml.safe_load(RAYJOB.read_text())
    assert rayjob["spec"]["entrypoint"].startswith("python -m workloads.train ")
    entrypoint, _ = cpu_entrypoint(rayjob["spec"]["entrypoint"], str(tmp_path))
    steps = int(TRAIN_CPU_PROFILE["steps"][0] or 0)
    every = int(TRAIN_CPU_PROFILE["report_every"][0] or 0)
    client = JobSubmissionClient(local_ray.dashboard_url)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env_of(rayjob))

    deadline = time.time() + 300
    status = client.get_job_status(job_id)
    while status not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.time() < deadline, "job did not finish in time"
        time.sleep(1)
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)

    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    parsed = [p for p in map(parse_line, logs.splitlines()) if p is not None]
    progress = [payload for kind, payload in parsed if kind == "PARK_METRICS"]
    results = [payload for kind, payload in parsed if kind == "PARK_RESULT"]
    assert [m["step"] for m in progress] == list(range(every, steps + 1, every))  # once each
    assert {"step", "loss", "tokens_per_s", "tokens_per_s_per_worker", "mfu"} <= set(progress[0])
    assert len(results) == 1
    assert results[0]["status"] == "succeeded"
    assert results[0]["final_step"] == steps
    assert results[0]["checkpoint_path"].endswith(f"checkpoint_{steps:08d}")
