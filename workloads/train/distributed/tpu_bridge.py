"""The TorchTPU bridge: the environment torch_tpu needs, built from Ray's real worker layout.

torch_tpu reads ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one ``host:port`` per rank of the slice,
in rank order; a rank finds itself at ``RANK % len``) and ``TORCH_TPU_TOPOLOGY`` once, before
the device is first used. Ray 2.60.0 sets neither, and its TPU ranks are sorted by slice name
only, so within a slice they are not host-major: the list cannot be derived from hostnames as
``torch.tpu.distributed.set_tpu_launch_env()`` does for torchrun. Instead the backend below
asks every worker for its rank, node IP, local rank, Ray-assigned chip and slice, plans the
environment with the pure :func:`plan_slice_env`, and sets it on each worker before Ray
creates the ``tpu_dist`` process group. ``TPU_VISIBLE_DEVICES`` names the chip Ray assigned,
so torch_tpu binds that chip rather than guessing from ``LOCAL_RANK``.

**The KubeRay TPU webhook** (GKE's Ray add-on) injects both variables into TPU pods already:
``TORCH_TPU_TOPOLOGY`` from the node pool's topology label and an address list in *pod* order,
``<host>:<8471 + i>`` for chip ``i`` of each host (``localhost`` on a single host, else the
pods' DNS names ``<group>-<replica>-<j>.<cluster>-headless``). The bridge reads what the pods
came with and says which it uses:

- the topology must agree with the run's (``--torch-tpu-topology``, from the infra's TPU
  catalog): if not, the RayJob was rendered for another slice than the pods run on, and the
  run stops with both values;
- the webhook's address list is used as it is when entry ``r`` is on rank ``r``'s own pod for
  every rank; otherwise (Ray numbered the ranks in another order) torch_tpu would make rank
  ``r`` listen on another pod's entry, so the bridge's list in rank order is used, with the
  webhook's base port and host names.

**IPv6.** torch_tpu splits each entry on ``':'`` and wants exactly two parts, so neither
``fd00::1:8070`` nor ``[fd00::1]:8070`` parses ("Invalid address format in
TORCH_TPU_SLICEBUILDER_ADDRESSES"). Hosts are therefore named, in order of preference:
``localhost`` when the whole slice is one host (what the webhook does too), the node's IPv4
address, else the pod's DNS name (the webhook's ``TPU_WORKER_HOSTNAMES[TPU_WORKER_ID]``, or the
pod's FQDN), which resolves to its IPv6 address. A slice with none of these is refused with a
message saying so.

What Google's TorchTPU sample sets and applies here is set too: ``TORCH_TPU_DEFER_AND_FUSE=1``
(torch_tpu queues ops and runs them fused rather than one by one), unless the job set it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.train
from ray.train.torch.config import TorchConfig, _TorchBackend

from workloads.protocol import TORCH_TPU_BASE_PORT
from workloads.train.config_rules import topology_chips

DEFAULT_BASE_PORT = TORCH_TPU_BASE_PORT
WEBHOOK_BASE_PORT = 8471  # kuberay-tpu-webhook's tpuProcessPortBase
ADDRESSES = "TORCH_TPU_SLICEBUILDER_ADDRESSES"
TOPOLOGY = "TORCH_TPU_TOPOLOGY"
DEFAULTS = {"TORCH_TPU_DEFER_AND_FUSE": "1"}  # set unless the job's env has them


class BridgeError(RuntimeError):
    """A worker layout torch_tpu could not form a slice from."""


@dataclass(frozen=True)
class WorkerInfo:
    """One training worker as Ray placed it, and what its pod's environment said."""

    rank: int
    node_ip: str
    local_rank: int
    chip: str | None = None  # Ray's TPU accelerator id on that host, e.g. "2"
    slice_name: str | None = None  # TPU_NAME of the slice (Ray sorts ranks by it)
    hostname: str | None = None  # the pod's DNS name (webhook: TPU_WORKER_HOSTNAMES[TPU_WORKER_ID])
    webhook_topology: str | None = None  # TORCH_TPU_TOPOLOGY the pod came with
    webhook_addresses: str | None = None  # TORCH_TPU_SLICEBUILDER_ADDRESSES the pod came with


@dataclass
class BridgePlan:
    """Every rank's variables, and why: one line per decision, for the job's log."""

    env: dict[int, dict[str, str]]
    notes: list[str] = field(default_factory=list)


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host.strip("[]")), ipaddress.IPv6Address)
    except ValueError:
        return False


def _parse_address(entry: str) -> tuple[str, int]:
    """``host:port`` as torch_tpu reads it: exactly one ':' (so no IPv6 literal)."""
    parts = entry.split(":")
    if len(parts) != 2 or not parts[1].isdigit():
        raise BridgeError(f"{entry!r} is not host:port as torch_tpu parses it")
    return parts[0], int(parts[1])


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


def _host_names(group: Sequence[WorkerInfo]) -> dict[str, str]:
    """Node IP → the host name torch_tpu's parser accepts (see the module's note on IPv6)."""
    ips = sorted({w.node_ip for w in group})
    if len(ips) == 1:
        return {ips[0]: "localhost"}
    names: dict[str, str] = {}
    for ip in ips:
        if not _is_ipv6(ip):
            names[ip] = ip
            continue
        candidates = [w.hostname for w in group if w.node_ip == ip and w.hostname]
        usable = [c for c in candidates if ":" not in c]
        if not usable:
            raise BridgeError(
                f"pod {ip} has only an IPv6 address, which torch_tpu cannot parse in "
                f"{ADDRESSES} (it splits host:port on ':'), and no DNS name: run with the KubeRay "
                "TPU webhook (it sets TPU_WORKER_HOSTNAMES) or give the pods IPv4 addresses"
            )
        names[ip] = usable[0]
    return names


def _webhook_agrees(
    group: Sequence[WorkerInfo], entries: list[str], names: Mapping[str, str]
) -> str | None:
    """None when the webhook's list works for these ranks as it is, else why it does not."""
    if len(entries) != len(group):
        return f"it has {len(entries)} entries for a slice of {len(group)} ranks"
    single_host = len({w.node_ip for w in group}) == 1
    for index, worker in enumerate(group):
        host, _ = _parse_address(entries[index])
        own = {names[worker.node_ip], worker.node_ip, worker.hostname}
        if host == "localhost" and single_host:
            continue
        if host not in own:
            return (
                f"entry {index} ({entries[index]}) is not on rank {worker.rank}'s pod "
                f"({worker.hostname or worker.node_ip}): the webhook lists pods in host order, "
                "Ray numbered the ranks in another (by TPU_NAME only), and torch_tpu takes "
                "entry RANK"
            )
    ports = [(w.node_ip, _parse_address(e)[1]) for w, e in zip(group, entries, strict=True)]
    if len(set(ports)) != len(ports):
        return "two ranks of one host would listen on the same port"
    return None


def plan_slice_env(
    workers: Sequence[WorkerInfo],
    *,
    torch_tpu_topology: str,
    num_slices: int = 1,
    base_port: int = DEFAULT_BASE_PORT,
    session_id: str | None = None,
) -> BridgePlan:
    """The torch_tpu variables for every rank, reconciled with what the webhook injected.

    Per slice, addresses are listed in rank order; each worker's port is ``base + local_rank``,
    unique on its host. Raises BridgeError when the layout cannot work (gaps in ranks, a slice
    not matching the topology, two workers on one chip, a webhook topology that disagrees, an
    IPv6-only pod without a DNS name).
    """
    slices = _group_slices(workers, num_slices)
    chips = topology_chips(torch_tpu_topology)
    plan = BridgePlan(env={})
    for number, group in enumerate(slices):
        label = f"slice {number} (ranks {group[0].rank}-{group[-1].rank})"
        if len(group) != chips:
            raise BridgeError(
                f"a slice of TORCH_TPU_TOPOLOGY {torch_tpu_topology} has {chips} "
                f"chips but {len(group)} workers: one worker per chip is needed"
            )
        placed = [(w.node_ip, w.chip) for w in group if w.chip is not None]
        if len(set(placed)) != len(placed):
            raise BridgeError(f"two workers were given the same chip: {sorted(placed)}")
        topologies = {w.webhook_topology for w in group if w.webhook_topology}
        if topologies and topologies != {torch_tpu_topology}:
            raise BridgeError(
                f"{label}: the pods came with TORCH_TPU_TOPOLOGY {sorted(topologies)} (the KubeRay "
                f"TPU webhook, from the node pool's topology) but the run was planned for "
                f"{torch_tpu_topology} (--torch-tpu-topology, from the TPU catalog): the RayJob "
                "and the node pool disagree on the slice"
            )
        if topologies:
            plan.notes.append(f"{label}: TORCH_TPU_TOPOLOGY {torch_tpu_topology} (webhook agrees)")
        names = _host_names(group)
        injected = {w.webhook_addresses for w in group if w.webhook_addresses}
        entries = sorted(injected)[0].split(",") if len(injected) == 1 else []
        port = base_port
        if entries:
            try:
                port = min(_parse_address(e)[1] for e in entries)
                why_not = _webhook_agrees(group, entries, names)
            except BridgeError as err:
                why_not = str(err)
        elif len(injected) > 1:
            why_not = "the pods of one slice came with different lists"
        else:
            why_not = "absent"
        if entries and why_not is None:
            addresses = entries
            plan.notes.append(
                f"{label}: {ADDRESSES} from the KubeRay TPU webhook, as injected: each rank's "
                "entry is on its own pod"
            )
        else:
            addresses = [f"{names[w.node_ip]}:{port + w.local_rank}" for w in group]
            if len(set(addresses)) != len(addresses):
                raise BridgeError(f"two workers share a host and local rank: {addresses}")
            source = (
                "no webhook list" if why_not == "absent" else f"not the webhook's list: {why_not}"
            )
            plan.notes.append(
                f"{label}: {ADDRESSES} planned by the bridge in Ray's rank order, base port "
                f"{port} ({source})"
            )
        joined = ",".join(addresses)
        for index, worker in enumerate(group):
            assert addresses[worker.rank % len(addresses)] == addresses[index]
            env = {ADDRESSES: joined, TOPOLOGY: torch_tpu_topology}
            if worker.chip is not None:
                env["TPU_VISIBLE_DEVICES"] = worker.chip
            if session_id is not None:
                env["TORCH_TPU_XPROF_SESSION_ID"] = session_id
            plan.env[worker.rank] = env
    return plan


def plan_torch_tpu_env(workers: Sequence[WorkerInfo], **options: Any) -> dict[int, dict[str, str]]:
    """The torch_tpu variables for every rank: ``{rank: {name: value}}``; the options are
    :func:`plan_slice_env`'s, whose plan this is without its notes."""
    return plan_slice_env(workers, **options).env


# ---- the Ray side (runs inside Ray Train's backend hooks) ---------------------------------


def own_hostname() -> str | None:
    """This pod's DNS name: the webhook's ``TPU_WORKER_HOSTNAMES[TPU_WORKER_ID]``, else the
    FQDN when it is a real name (not an address)."""
    hostnames = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    worker_id = os.environ.get("TPU_WORKER_ID", "")
    if hostnames and worker_id.isdigit() and int(worker_id) < len(hostnames):
        return hostnames[int(worker_id)]
    fqdn = socket.getfqdn()
    return fqdn if fqdn and ":" not in fqdn and fqdn != "localhost" else None


def describe_worker() -> WorkerInfo:
    """Run on a worker: who it is, where it is, which chip Ray gave it, what the pod said."""
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
        hostname=own_hostname(),
        webhook_topology=os.environ.get(TOPOLOGY) or None,
        webhook_addresses=os.environ.get(ADDRESSES) or None,
    )


def apply_env(env: Mapping[str, str], notes: Sequence[str] = ()) -> None:
    """Run on a worker: set the planned variables (before anything touches the device), and
    the sample's defaults the job did not set; rank 0 says where they came from."""
    os.environ.update(env)
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    if notes:
        for note in notes:
            print(f"torch_tpu bridge: {note}", flush=True)


class _TorchTPUBackend(_TorchBackend):
    """Ray's torch backend, with the torch_tpu environment set before the process group."""

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        infos: list[WorkerInfo] = worker_group.execute(describe_worker)
        num_slices = backend_config.num_slices
        if hasattr(worker_group, "get_worker_group_context"):
            num_slices = worker_group.get_worker_group_context().num_slices or num_slices
        plan = plan_slice_env(
            infos,
            torch_tpu_topology=backend_config.torch_tpu_topology,
            num_slices=num_slices,
            base_port=backend_config.base_port,
            session_id=str(time.time_ns()),
        )
        ray.get(
            [
                worker_group.execute_single_async(
                    i, apply_env, plan.env[info.rank], plan.notes if info.rank == 0 else ()
                )
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
