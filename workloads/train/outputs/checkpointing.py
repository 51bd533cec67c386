"""Sharded checkpoints with torch.distributed.checkpoint (DCP), the same for DDP and FSDP2.

Every rank writes its own shards straight into one checkpoint folder of the run's storage
(``storage_path``: the bucket through the pod's GCS FUSE mount on GKE, whose streaming writes
upload each file as it is written), which Ray Train then registers without a copy; a resume
reads the folder in place (workloads/train/distributed/runenv.py). DCP's ``.metadata`` (rank 0)
names the shard files relative to that folder, so loading reads it back with any world size. The
training state (step, last loss) rides along as ``train_state.json``.

DCP coordinates ranks with object collectives; they run on a gloo group so that they work
whatever the training backend is (tpu_dist, nccl or gloo).

Each rank also writes where its data stream stands, ``data_state/rank-NNNNN.json``: a name of
its own, since every rank writes into the same folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

STATE_FILE = "train_state.json"
DATA_STATE_DIR = "data_state"


@dataclass
class TrainState:
    """What the loop needs besides weights and optimizer moments to continue a run."""

    step: int = 0
    loss: float | None = None
    tokens_seen: int = 0
    resumes: int = 0


def coordination_group(device_type: str) -> dist.ProcessGroup | None:
    """A gloo group for DCP's planning collectives (the default group when it is gloo)."""
    if device_type == "cpu":
        return None
    return dist.new_group(backend="gloo")


def save(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    group: dist.ProcessGroup | None = None,
    data_state: dict[str, Any] | None = None,
) -> None:
    """Write this rank's shards and data position (and, on rank 0, the metadata and train
    state) to ``directory``."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_state, "optim": optim_state},
        checkpoint_id=str(directory),
        process_group=group,
    )
    rank = dist.get_rank() if dist.is_initialized() else 0
    if data_state is not None:
        folder = Path(directory) / DATA_STATE_DIR
        folder.mkdir(exist_ok=True)
        (folder / f"rank-{rank:05d}.json").write_text(json.dumps({"step": state.step} | data_state))
    if rank == 0:
        (Path(directory) / STATE_FILE).write_text(json.dumps(asdict(state)))


def load_data_state(directory: str | Path, rank: int, step: int) -> dict[str, Any]:
    """This rank's data position in a checkpoint; for a checkpoint without one (older runs,
    or a rank that did not exist then), rank 0's, else just the step."""
    folder = Path(directory) / DATA_STATE_DIR
    for name in (f"rank-{rank:05d}.json", "rank-00000.json"):
        path = folder / name
        if path.exists():
            found: dict[str, Any] = json.loads(path.read_text())
            if name != f"rank-{rank:05d}.json":
                found["world_size"] = -1  # another rank's position: start a new epoch
            return found
    return {"step": step}


def load(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    group: dist.ProcessGroup | None = None,
) -> TrainState:
    """Restore model and optimizer in place from a checkpoint folder; return its train state."""
    model_state, optim_state = get_state_dict(model, optimizer)
    combined = {"model": model_state, "optim": optim_state}
    dcp.load(combined, checkpoint_id=str(directory), process_group=group)
    set_state_dict(
        model, optimizer, model_state_dict=combined["model"], optim_state_dict=combined["optim"]
    )
    return TrainState(**json.loads((Path(directory) / STATE_FILE).read_text()))
