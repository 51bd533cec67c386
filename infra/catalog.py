"""The TPU catalog: the one place TPU facts live.

Every layer (config validation, node pools, KubeRay manifests, the RayJob's flags, cost) asks
this module; nothing else hard-codes a chip count, a label or a Ray name.

Facts are keyed on (machine type, topology), never topology alone: ``2x4`` is one host on
``ct6e-standard-8t`` but two hosts on ``ct6e-standard-4t``. Sources: GKE's TPU docs, KubeRay
v1.7.0 samples (4x4 → numOfHosts 4, 16x16 → 64) and AI-Hypercomputer/xpk's system table.

Adding a generation is data only: a ``TpuGeneration`` and its machine types (tests/infra/
test_records.py adds v5e's and a made-up next one that way). What differs between generations is
a field, never a branch on a name: devices per chip (TPU7x exposes each chip's two TensorCores
as two runtime devices), how a multi-host slice is placed (COMPACT or a workload policy), the
boot disk type, topologies listed or generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Literal

# How GKE places the hosts of a multi-host slice: a COMPACT placement policy beside the pool's
# tpu_topology (v6e), or a workload policy, a regional compute ResourcePolicy of type
# HIGH_THROUGHPUT named on the pool (TPU7x: GKE refuses COMPACT there, "Use workload policy
# instead", vllm-project/ci-infra PR 547; GKE's tpu-ironwood page).
MultiHostPlacement = Literal["compact", "workload_policy"]


@dataclass(frozen=True)
class TpuGeneration:
    """Facts shared by every machine type of one TPU generation."""

    name: str  # "v6e"
    machine_type_prefix: str  # its GKE machine types' family, e.g. "ct6e" (ct6e-standard-4t)
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    ray_name: str  # Ray's accelerator version: pod types ("v6e-16"); "v5litepod" for v5e
    ray_accelerator_type: str  # Ray's accelerator_type, e.g. "TPU-V6E"
    # A device is what the runtime addresses (a torch device, a vLLM TP rank, a Ray `TPU`
    # unit): one per chip on v6e, one per TensorCore on TPU7x. FLOPs and HBM are per device.
    peak_bf16_tflops_per_device: float
    hbm_gib_per_device: int  # nominal, as sold (32 GB on v6e)
    # HBM as the runtime reports it to a process (vLLM's `determine_available_memory`, torch's
    # device memory): what budgets are made against, never the nominal figure.
    runtime_hbm_bytes_per_device: int
    min_gke_version: str  # oldest GKE version with node pools of this generation
    zones: tuple[str, ...]  # zones known to offer it (Google adds more over time)
    devices_per_chip: int = 1  # also Ray's RAY_TPU_RESOURCE_PER_CHIP where it is over 1
    multi_host_placement: MultiHostPlacement = "compact"
    boot_disk_type: str | None = None  # None: GKE's default (pd-balanced)
    pod_type_units_per_chip: int = 1  # Ray pod type counts chips (v6e) or cores (v4, v5p)
    # The single-host process counts torch_tpu forms a slice from, and TORCH_TPU_TOPOLOGY for
    # each (torch_tpu 0.2.0 _internal/utils/hardware.py:38-76: any other count is refused).
    torch_tpu_world_topologies: tuple[tuple[int, str], ...] = ()
    # How Ray places a slice: the topologies Ray takes as one VM holding every chip (ray/
    # _private/accelerators/tpu.py get_chips_per_host: TPU_8_CHIPS_PER_HOST_TYPES x
    # TPU_SINGLE_HOST_TOPOLOGIES); any other topology Ray takes as hosts of
    # RAY_DEFAULT_CHIPS_PER_HOST chips. Serve LLM sizes a slice's placement group so.
    ray_single_vm_topologies: tuple[str, ...] = ()
    # HBM bandwidth per device, bytes/s (0: not known; the serving drain then takes the slowest
    # known generation's, infra.engine.decode_step_ceiling_s).
    hbm_bytes_per_s_per_device: int = 0
    # Hosts (VMs) in one reservation sub-block, the unit an All Capacity reservation hands out
    # (None: not documented for the generation, no check).
    sub_block_hosts: int | None = None
    # Spot capacity documented by Google for the generation (TPU7x's page names reservations,
    # calendar mode and the account team; cluster-toolkit's TPU7x blueprints: reservation,
    # flex-start and queued only).
    spot_documented: bool = True


@dataclass(frozen=True)
class TpuMachineType:
    """A GKE machine type and the slice topologies it can form. Its generation is the one whose
    machine-type prefix its name starts with (ct6e-standard-4t: v6e)."""

    name: str
    chips_per_host: int
    topologies: tuple[str, ...]
    vcpus: int
    memory_gib: int
    # Local SSD the machine type comes with, GiB; None: not known. GKE's TPU and machine-type
    # pages stored here list chips, vCPUs and memory of ct6e but no local SSD, so none is
    # assumed: pods' scratch lives on the boot disk (infra.resolve.disk).
    local_ssd_gib: int | None = None

    @property
    def generation(self) -> str:
        """The name of its TpuGeneration, by the machine-type prefix."""
        family = self.name.split("-")[0]
        for generation in GENERATIONS.values():
            if generation.machine_type_prefix == family:
                return generation.name
        raise CatalogError(f"no TPU generation has machine types named {family}-*")


def cube_topologies(max_side: int) -> tuple[str, ...]:
    """The 3-D slices of 4-chip hosts up to a ``max_side`` cube, smallest first: ``2x2x1`` (one
    host), then AxBxC with 2 <= A <= B <= C <= max_side, powers of two (``2x2x2`` two hosts,
    ``2x2x4`` four, ``2x4x4`` eight, ``4x4x4`` sixteen: one sub-block). Each is in Ray 2.60's
    VALID_TPU_TOPOLOGY["v7x"], so Ray's topology-aware APIs take it."""
    sides = [2**i for i in range(1, max_side.bit_length()) if 2**i <= max_side]
    shapes = [(2, 2, 1)] + [(a, b, c) for a in sides for b in sides for c in sides if a <= b <= c]
    return tuple("x".join(map(str, s)) for s in sorted(shapes, key=lambda s: (math.prod(s), s)))


# TPU v6e (Trillium). Zones: those in Google's tables as read for FACTS.md (the table was cut,
# so stacks may add zones with `park:extraTpuZones`).
GENERATIONS: dict[str, TpuGeneration] = {
    g.name: g
    for g in (
        TpuGeneration(
            name="v6e",
            machine_type_prefix="ct6e",
            gke_accelerator="tpu-v6e-slice",
            ray_name="v6e",
            ray_accelerator_type="TPU-V6E",
            peak_bf16_tflops_per_device=918.0,
            hbm_gib_per_device=32,
            # 33,550,237,696 B = 31.25 GiB: a v6e chip's memory limit as the TPU runtime reports
            # it (vLLM usage stats logged on v6e, vllm-project/vllm PR 16211; FACTS.md).
            runtime_hbm_bytes_per_device=33_550_237_696,
            min_gke_version="1.31.2-gke.1115000",
            zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
            torch_tpu_world_topologies=((1, "1,1,1"), (4, "2,2,1"), (8, "2,4,1")),
            ray_single_vm_topologies=("1x1", "2x2", "2x4"),
            hbm_bytes_per_s_per_device=1_638_000_000_000,  # 1,638 GB/s per chip (FACTS.md)
        ),
        # TPU7x (Ironwood). Sources: /work/shared/reference/FACTS.md (TPU7x); GKE's tpu-ironwood
        # page (GKE floor, workload policy); TPU docs' tpu7x page (2,307 TFLOP/s bf16 and 192 GiB
        # per chip, 2 TensorCores); torch_tpu 0.2.0 _internal/utils/hardware.py (2 devices per
        # chip, get_hbm_bytes_per_device = 192 GiB // 2, get_bf16_flops_per_device = half the
        # chip's); Ray 2.60 (accelerator "TPU-V7X", version "v7x", pod types counting
        # TensorCores: tpu7x-8 is one 4-chip host). The runtime's own per-device limit is not
        # published: the nominal 96 GiB less v6e's runtime/nominal ratio (31.25/32) is
        # budgeted until measured. Boot disk: hyperdisk-balanced, as Google's cluster-toolkit
        # gke-tpu-7x blueprint sets it (no PD row for TPU7x in Google's disk table).
        TpuGeneration(
            name="tpu7x",
            machine_type_prefix="tpu7x",
            gke_accelerator="tpu7x",
            ray_name="v7x",
            ray_accelerator_type="TPU-V7X",
            peak_bf16_tflops_per_device=1153.5,
            hbm_gib_per_device=96,
            runtime_hbm_bytes_per_device=96 * 1024**3 * 125 // 128,
            min_gke_version="1.34.0-gke.2201000",
            zones=("us-central1-c",),
            pod_type_units_per_chip=2,
            devices_per_chip=2,
            multi_host_placement="workload_policy",
            boot_disk_type="hyperdisk-balanced",
            # torch_tpu 0.2.0 hardware.py _V7_TOPOLOGY: world sizes in devices, 4-D topologies
            torch_tpu_world_topologies=((2, "1,1,1,2"), (4, "1,2,1,2"), (8, "2,2,1,2")),
            sub_block_hosts=16,  # 4x4x4 (FACTS.md, capacity: reservation paths)
            spot_documented=False,
        ),
    )
}

MACHINE_TYPES: dict[str, TpuMachineType] = {
    m.name: m
    for m in (
        TpuMachineType("ct6e-standard-1t", 1, ("1x1",), vcpus=44, memory_gib=176),
        TpuMachineType(
            "ct6e-standard-4t",
            4,
            ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
            vcpus=180,
            memory_gib=720,
        ),
        TpuMachineType("ct6e-standard-8t", 8, ("2x4",), vcpus=180, memory_gib=1440),
        # tpu7x-standard-4t: 224 vCPUs, 960 GB (TPU docs' tpu7x page). tpu7x-standard-1t's vCPUs
        # and memory are not published in what was read, so only the 4-chip VM is offered.
        TpuMachineType("tpu7x-standard-4t", 4, cube_topologies(4), vcpus=224, memory_gib=894),
    )
}

# Ray's chips per host for a topology it does not take as one VM (ray/_private/accelerators/
# tpu.py DEFAULT_TPU_NUM_CHIPS_PER_HOST).
RAY_DEFAULT_CHIPS_PER_HOST = 4

# Kubernetes facts that do not vary by generation.
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT_KEY = "google.com/tpu"
TPU_TAINT_VALUE = "present"
TPU_TAINT_EFFECT = "NoSchedule"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
SPOT_LABEL = "cloud.google.com/gke-spot"
# Ray counts `TPU` per chip unless this says how many per chip (Ray 2.60
# _private/accelerators/tpu.py get_tpu_resource_per_chip; read in the raylet, and in the process
# that sizes a placement group: ScalingConfig, SlicePlacementGroup).
RAY_TPU_RESOURCE_PER_CHIP = "RAY_TPU_RESOURCE_PER_CHIP"


class CatalogError(ValueError):
    """A (machine type, topology) the catalog does not know."""


@dataclass(frozen=True)
class TpuSlice:
    """Everything a layer needs to know about one slice of (machine type, topology)."""

    machine_type: str
    topology: str
    generation: TpuGeneration
    chips: int
    chips_per_host: int
    hosts: int

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def gke_accelerator(self) -> str:
        return self.generation.gke_accelerator

    @property
    def ray_accelerator_type(self) -> str:
        return self.generation.ray_accelerator_type

    @property
    def ray_pod_type(self) -> str:
        """Ray's name for the slice, e.g. ``v6e-16`` (head resource ``TPU-v6e-16-head``)."""
        return f"{self.generation.ray_name}-{self.chips * self.generation.pod_type_units_per_chip}"

    @property
    def ray_hosts(self) -> int:
        """The hosts Ray assumes the slice has (TpuGeneration.ray_single_vm_topologies): where
        it differs from ``hosts``, Serve LLM's placement group is misshaped."""
        if self.topology in self.generation.ray_single_vm_topologies:
            return 1
        return math.ceil(self.chips / RAY_DEFAULT_CHIPS_PER_HOST)

    @property
    def devices(self) -> int:
        """Runtime devices of the slice: one Ray Train worker or vLLM TP rank each."""
        return self.chips * self.generation.devices_per_chip

    @property
    def device_word(self) -> str:
        """What reports call one device: "chip" where a chip is one, else "device"."""
        return "chip" if self.generation.devices_per_chip == 1 else "device"

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.generation.devices_per_chip

    @property
    def workload_policy(self) -> bool:
        """Placed by a workload policy (a multi-host slice of such a generation)."""
        return self.multi_host and self.generation.multi_host_placement == "workload_policy"

    @property
    def torch_tpu_topology(self) -> str:
        """torch_tpu's ``TORCH_TPU_TOPOLOGY``: ``4x4`` → ``4,4,1``; with two devices per chip
        a fourth axis counts them (``2x2x2`` → ``2,2,2,2``: torch_tpu 0.2.0
        _internal/utils/hardware.py, _DEVICES_PER_CHIP)."""
        dims = (*topology_dims(self.topology), 1, 1)[:3]
        if self.generation.devices_per_chip > 1:
            dims = (*dims, self.generation.devices_per_chip)
        return ",".join(str(d) for d in dims)

    @property
    def runtime_hbm_gib(self) -> float:
        """One device's HBM as the runtime reports it, in GiB (31.25 on v6e)."""
        return self.generation.runtime_hbm_bytes_per_device / 1024**3

    @property
    def peak_bf16_tflops(self) -> float:
        return self.devices * self.generation.peak_bf16_tflops_per_device

    @property
    def pod_cpu(self) -> int:
        """CPUs a Ray worker pod requests on one host: the VM less room for system pods."""
        return int(MACHINE_TYPES[self.machine_type].vcpus * 0.9)

    @property
    def pod_memory_gib(self) -> int:
        return int(MACHINE_TYPES[self.machine_type].memory_gib * 0.85)

    def ray_env(self) -> dict[str, str]:
        """What Ray processes need to count a `TPU` per device: nothing where a chip is one."""
        per_chip = self.generation.devices_per_chip
        return {RAY_TPU_RESOURCE_PER_CHIP: str(per_chip)} if per_chip > 1 else {}

    def node_labels(self) -> dict[str, str]:
        """Labels GKE puts on every node of the slice; pods select on them."""
        return {ACCELERATOR_LABEL: self.gke_accelerator, TOPOLOGY_LABEL: self.topology}


def topology_dims(topology: str) -> tuple[int, ...]:
    """``"4x4"`` → ``(4, 4)``; raises CatalogError on anything else."""
    parts = topology.lower().split("x")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise CatalogError(f"topology {topology!r} is not of the form AxB or AxBxC")
    return tuple(int(p) for p in parts)


@cache
def lookup(machine_type: str, topology: str) -> TpuSlice:
    """Resolve a (machine type, topology) pair, or raise CatalogError saying what is allowed."""
    machine = MACHINE_TYPES.get(machine_type)
    if machine is None:
        raise CatalogError(
            f"unknown TPU machine type {machine_type!r}; allowed: {', '.join(MACHINE_TYPES)}"
        )
    if topology not in machine.topologies:
        raise CatalogError(
            f"topology {topology!r} is not offered on {machine_type}; "
            f"allowed: {', '.join(machine.topologies)}"
        )
    chips = math.prod(topology_dims(topology))
    if chips % machine.chips_per_host:
        raise CatalogError(f"{topology} has {chips} chips, not a multiple of a {machine_type} host")
    return TpuSlice(
        machine_type=machine_type,
        topology=topology,
        generation=GENERATIONS[machine.generation],
        chips=chips,
        chips_per_host=machine.chips_per_host,
        hosts=chips // machine.chips_per_host,
    )


def all_slices() -> list[TpuSlice]:
    """Every valid (machine type, topology) row, for tests and docs."""
    return [lookup(m.name, t) for m in MACHINE_TYPES.values() for t in m.topologies]


def generation_of(machine_type: str) -> TpuGeneration:
    return GENERATIONS[MACHINE_TYPES[machine_type].generation]
