"""The TorchTPU bridge: the environment torch_tpu needs, built from Ray's real worker layout.

torch_tpu reads ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one ``host:port`` per rank of the slice,
in rank order; a rank finds itself at ``RANK % len``) and ``TORCH_TPU_TOPOLOGY`` once, before
the device is first used. Ray 2.60.0 sets neither, and its TPU ranks are sorted by slice name
only, so within a slice they are not host-major: the list cannot be derived from hostnames as
``torch.tpu.distributed.set_tpu_launch_env()`` does for torchrun. Instead the backend below
asks every worker for its rank, node IP, local rank, Ray-assigned chip and slice, plans the
environment with the pure :func:`plan_torch_tpu_env`, and sets it on each worker before Ray
creates the ``tpu_dist`` process group. ``TPU_VISIBLE_DEVICES`` names the chip Ray assigned,
so torch_tpu binds that chip rather than guessing from ``LOCAL_RANK``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.train
from ray.train.torch.config import TorchConfig, _TorchBackend

from workloads.protocol import TORCH_TPU_BASE_PORT
from workloads.train.config import topology_chips

DEFAULT_BASE_PORT = TORCH_TPU_BASE_PORT


class BridgeError(RuntimeError):
    """A worker layout torch_tpu could not form a slice from."""


@dataclass(frozen=True)
class WorkerInfo:
    """One training worker as Ray placed it."""

    rank: int
    node_ip: str
    local_rank: int
    chip: str | None = None  # Ray's TPU accelerator id on that host, e.g. "2"
    slice_name: str | None = None  # TPU_NAME of the slice (Ray sorts ranks by it)


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _group_slices(workers: Sequence[WorkerInfo], num_slices: int) -> list[list[WorkerInfo]]:
    """Split ranks into slices: contiguous, equal blocks (how Ray numbers multi-slice ranks)."""
    ordered = sorted(workers, key=lambda w: w.rank)
    if [w.rank for w in ordered] != list(range(len(ordered))):
        raise BridgeError(
            f"ranks must be 0..{len(ordered) - 1} once each, got {sorted(w.rank for w in workers)}"
        )
    if num_slices < 1 or len(ordered) % num_slices:
        raise BridgeError(f"{len(ordered)} workers do not split into {num_slices} equal slices")
    per_slice = len(ordered) // num_slices
    slices = [ordered[i : i + per_slice] for i in range(0, len(ordered), per_slice)]
    names = [{w.slice_name for w in group} for group in slices]
    named = all(None not in n for n in names)
    if named and (any(len(n) != 1 for n in names) or len(set().union(*names)) != num_slices):
        raise BridgeError(
            "ranks of one TPU slice are not contiguous: "
            + "; ".join(
                f"ranks {g[0].rank}-{g[-1].rank}: {sorted(n)}"  # type: ignore[type-var]
                for g, n in zip(slices, names, strict=True)
            )
        )
    return slices


def plan_torch_tpu_env(
    workers: Sequence[WorkerInfo],
    *,
    torch_tpu_topology: str,
    num_slices: int = 1,
    base_port: int = DEFAULT_BASE_PORT,
    session_id: str | None = None,
) -> dict[int, dict[str, str]]:
    """The torch_tpu variables for every rank: ``{rank: {name: value}}``.

    Per slice, addresses are listed in rank order; each worker's port is ``base_port +
    local_rank``, unique on its host. Raises BridgeError when the layout cannot work (gaps in
    ranks, a slice not matching the topology, two workers on one host port or chip).
    """
    slices = _group_slices(workers, num_slices)
    chips = topology_chips(torch_tpu_topology)
    plan: dict[int, dict[str, str]] = {}
    for group in slices:
        if len(group) != chips:
            raise BridgeError(
                f"a slice of TORCH_TPU_TOPOLOGY {torch_tpu_topology} has {chips} "
                f"chips but {len(group)} workers: one worker per chip is needed"
            )
        addresses = [_address(w.node_ip, base_port + w.local_rank) for w in group]
        if len(set(addresses)) != len(addresses):
            raise BridgeError(f"two workers share a host and local rank: {addresses}")
        placed = [(w.node_ip, w.chip) for w in group if w.chip is not None]
        if len(set(placed)) != len(placed):
            raise BridgeError(f"two workers were given the same chip: {sorted(placed)}")
        joined = ",".join(addresses)
        for index, worker in enumerate(group):
            assert addresses[worker.rank % len(addresses)] == addresses[index]
            env = {
                "TORCH_TPU_SLICEBUILDER_ADDRESSES": joined,
                "TORCH_TPU_TOPOLOGY": torch_tpu_topology,
            }
            if worker.chip is not None:
                env["TPU_VISIBLE_DEVICES"] = worker.chip
            if session_id is not None:
                env["TORCH_TPU_XPROF_SESSION_ID"] = session_id
            plan[worker.rank] = env
    return plan


# ---- the Ray side (runs inside Ray Train's backend hooks) ---------------------------------


def describe_worker() -> WorkerInfo:
    """Run on a worker: who it is, where it is, which chip Ray gave it."""
    context = ray.train.get_context()
    chips = ray.get_runtime_context().get_accelerator_ids().get("TPU", [])
    if len(chips) > 1:
        raise BridgeError(
            f"worker holds {len(chips)} TPU chips {chips}; torch_tpu needs exactly "
            "one per process: set resources_per_worker={'TPU': 1}"
        )
    return WorkerInfo(
        rank=context.get_world_rank(),
        node_ip=ray.util.get_node_ip_address(),
        local_rank=context.get_local_rank(),
        chip=chips[0] if chips else None,
        slice_name=os.environ.get("TPU_NAME") or None,
    )


def apply_env(env: Mapping[str, str]) -> None:
    """Run on a worker: set the planned variables (before anything touches the device)."""
    os.environ.update(env)


class _TorchTPUBackend(_TorchBackend):
    """Ray's torch backend, with the torch_tpu environment set before the process group."""

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        infos: list[WorkerInfo] = worker_group.execute(describe_worker)
        num_slices = backend_config.num_slices
        if hasattr(worker_group, "get_worker_group_context"):
            num_slices = worker_group.get_worker_group_context().num_slices or num_slices
        plan = plan_torch_tpu_env(
            infos,
            torch_tpu_topology=backend_config.torch_tpu_topology,
            num_slices=num_slices,
            base_port=backend_config.base_port,
            session_id=str(time.time_ns()),
        )
        ray.get(
            [
                worker_group.execute_single_async(i, apply_env, plan[info.rank])
                for i, info in enumerate(infos)
            ]
        )
        super().on_start(worker_group, backend_config)


@dataclass
class TorchTPUConfig(TorchConfig):
    """Ray's TorchConfig plus the bridge; pass it as ``TorchTrainer(torch_config=...)``.

    ``backend`` is ``tpu_dist`` on TPU; the tests run the same hook with ``gloo`` on CPU.
    """

    backend: str | None = "tpu_dist"
    torch_tpu_topology: str = "1,1,1"
    num_slices: int = 1
    # The RayJob's runtime env may set TORCH_TPU_BASE_PORT; torch_tpu's own default otherwise.
    base_port: int = field(
        default_factory=lambda: int(os.environ.get("TORCH_TPU_BASE_PORT", DEFAULT_BASE_PORT))
    )

    @property
    def backend_cls(self) -> type[_TorchBackend]:
        return _TorchTPUBackend
