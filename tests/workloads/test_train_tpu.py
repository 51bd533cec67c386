"""The TPU path without a TPU: the torch_tpu bridge's plan and the ScalingConfig it builds."""

from __future__ import annotations

import random

import pytest
from ray.util.tpu import get_tpu_num_slices_for_workers

from workloads.train.config_check import parse_args, resolve
from workloads.train.distributed.scaling import build_scaling_config, build_torch_config
from workloads.train.distributed.tpu_bridge import (
    BridgeError,
    TorchTPUConfig,
    WorkerInfo,
    plan_slice_env,
    plan_torch_tpu_env,
)

TPU_4X4 = [
    "--accelerator",
    "tpu",
    "--tpu-topology",
    "4x4",
    "--tpu-accelerator-type",
    "TPU-V6E",
    "--torch-tpu-topology",
    "4,4,1",
    "--chips-per-host",
    "4",
]


def _slice_workers(
    hosts: int,
    chips_per_host: int,
    *,
    slice_name: str | None = None,
    first_rank: int = 0,
    host_prefix: str = "10.0.0",
    rng: random.Random | None = None,
) -> list[WorkerInfo]:
    """Workers of one slice, with ranks dealt out in a shuffled (not host-major) order."""
    placements = [(h, c) for h in range(hosts) for c in range(chips_per_host)]
    if rng is not None:
        rng.shuffle(placements)
    local_counts: dict[int, int] = {}
    workers = []
    for offset, (host, chip) in enumerate(placements):
        local_rank = local_counts.get(host, 0)
        local_counts[host] = local_rank + 1
        workers.append(
            WorkerInfo(
                rank=first_rank + offset,
                node_ip=f"{host_prefix}.{host + 1}",
                local_rank=local_rank,
                chip=str(chip),
                slice_name=slice_name,
            )
        )
    return workers


def _own_address(env: dict[str, str], rank: int) -> str:
    addresses = env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    return addresses[rank % len(addresses)]


@pytest.mark.parametrize("seed", range(5))
def test_shuffled_ranks_each_find_their_own_host_port(seed: int) -> None:
    workers = _slice_workers(4, 4, rng=random.Random(seed))
    plan = plan_torch_tpu_env(workers, torch_tpu_topology="4,4,1")

    assert sorted(plan) == list(range(16))
    lists = {env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] for env in plan.values()}
    assert len(lists) == 1, "every rank of a slice must see the same list"
    for w in workers:
        env = plan[w.rank]
        assert _own_address(env, w.rank) == f"{w.node_ip}:{8070 + w.local_rank}"
        assert env["TORCH_TPU_TOPOLOGY"] == "4,4,1"
        assert env["TPU_VISIBLE_DEVICES"] == w.chip
    # Ray's order is kept: the list follows ranks, not hosts.
    hosts_in_list = [a.split(":")[0] for a in next(iter(lists)).split(",")]
    assert hosts_in_list == [w.node_ip for w in sorted(workers, key=lambda w: w.rank)]


def test_rank_order_of_the_input_does_not_matter() -> None:
    workers = _slice_workers(2, 4, rng=random.Random(7))
    shuffled = list(workers)
    random.Random(1).shuffle(shuffled)
    assert plan_torch_tpu_env(shuffled, torch_tpu_topology="2,4,1") == plan_torch_tpu_env(
        workers, torch_tpu_topology="2,4,1"
    )


def test_multi_slice_gets_one_list_per_slice() -> None:
    rng = random.Random(3)
    workers = _slice_workers(4, 4, slice_name="slice-a", rng=rng) + _slice_workers(
        4, 4, slice_name="slice-b", first_rank=16, host_prefix="10.0.1", rng=rng
    )
    plan = plan_torch_tpu_env(workers, torch_tpu_topology="4,4,1", num_slices=2, session_id="42")

    first = plan[0]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    second = plan[16]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert len(first) == len(second) == 16
    assert all(a.startswith("10.0.0.") for a in first)
    assert all(a.startswith("10.0.1.") for a in second)
    for w in workers:
        assert _own_address(plan[w.rank], w.rank) == f"{w.node_ip}:{8070 + w.local_rank}"
        assert plan[w.rank]["TORCH_TPU_XPROF_SESSION_ID"] == "42"


def test_multi_slice_without_slice_names_splits_ranks_in_blocks() -> None:
    workers = _slice_workers(2, 2) + _slice_workers(2, 2, first_rank=4, host_prefix="10.0.9")
    plan = plan_torch_tpu_env(workers, torch_tpu_topology="2,2,1", num_slices=2)
    assert plan[5]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].startswith("10.0.9.")
    assert plan[1]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].startswith("10.0.0.")


def test_a_single_host_slice_is_localhost() -> None:
    """As the webhook writes it for one host: no address to get wrong, IPv4 or IPv6."""
    for ip in ("10.0.0.7", "fd00::7"):
        workers = [WorkerInfo(r, ip, r, str(r)) for r in range(4)]
        plan = plan_torch_tpu_env(workers, torch_tpu_topology="2,2,1")
        assert plan[2]["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == ",".join(
            f"localhost:{8070 + i}" for i in range(4)
        )


def test_interleaved_slices_are_refused() -> None:
    a = _slice_workers(1, 4, slice_name="a")
    b = _slice_workers(1, 4, slice_name="b", first_rank=4, host_prefix="10.0.1")
    # Rank 3 sits on slice b's host and rank 4 on slice a's: Ray never numbers slices so.
    a[3], b[0] = WorkerInfo(3, b[0].node_ip, 0, "0", "b"), WorkerInfo(4, a[3].node_ip, 3, "3", "a")
    with pytest.raises(BridgeError, match="not contiguous"):
        plan_torch_tpu_env(a + b, torch_tpu_topology="2,2,1", num_slices=2)


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        (_slice_workers(1, 4)[:3], "4 chips but 3 workers"),
        ([WorkerInfo(0, "h", 0), WorkerInfo(2, "h", 1)], "ranks must be"),
        ([WorkerInfo(0, "h", 0, "0"), WorkerInfo(1, "h", 0, "1")], "share a host and local rank"),
        ([WorkerInfo(0, "h", 0, "0"), WorkerInfo(1, "h", 1, "0")], "same chip"),
    ],
)
def test_impossible_layouts_are_refused(workers: list[WorkerInfo], message: str) -> None:
    topology = "2,2,1" if len(workers) != 2 else "2,1,1"
    with pytest.raises(BridgeError, match=message):
        plan_torch_tpu_env(workers, torch_tpu_topology=topology)


def _v6_workers(hostnames: bool) -> list[WorkerInfo]:
    """Two IPv6-only hosts of two chips, ranks interleaved across hosts."""
    layout = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (host, local rank) of ranks 0..3
    return [
        WorkerInfo(
            rank=r,
            node_ip=f"fd00::{h + 1}",
            local_rank=lr,
            chip=str(lr),
            hostname=f"workers-0-{h}.park-train-headless" if hostnames else None,
        )
        for r, (h, lr) in enumerate(layout)
    ]


def test_ipv6_pods_are_named_by_dns_because_torch_tpu_splits_on_colons() -> None:
    plan = plan_torch_tpu_env(_v6_workers(hostnames=True), torch_tpu_topology="2,2,1")
    addresses = plan[0]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert addresses == [
        "workers-0-0.park-train-headless:8070",
        "workers-0-1.park-train-headless:8070",
        "workers-0-0.park-train-headless:8071",
        "workers-0-1.park-train-headless:8071",
    ]
    assert all(len(entry.split(":")) == 2 for entry in addresses)  # what torch_tpu's parser wants
    with pytest.raises(BridgeError, match="only an IPv6 address"):
        plan_torch_tpu_env(_v6_workers(hostnames=False), torch_tpu_topology="2,2,1")


# ---- the KubeRay TPU webhook's variables ------------------------------------------------------


def _webhook(workers: list[WorkerInfo], topology: str, addresses: str) -> list[WorkerInfo]:
    from dataclasses import replace

    return [replace(w, webhook_topology=topology, webhook_addresses=addresses) for w in workers]


WEBHOOK_V6E_8 = ",".join(f"localhost:{8471 + i}" for i in range(8))  # its e2e test's value


def test_the_webhooks_single_host_list_is_used_as_injected() -> None:
    workers = _webhook(_slice_workers(1, 8, rng=random.Random(2)), "2,4,1", WEBHOOK_V6E_8)
    plan = plan_slice_env(workers, torch_tpu_topology="2,4,1")
    for w in workers:
        assert plan.env[w.rank]["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == WEBHOOK_V6E_8
    assert any("from the KubeRay TPU webhook, as injected" in n for n in plan.notes)
    assert any("webhook agrees" in n for n in plan.notes)


def test_a_webhook_list_in_pod_order_is_replaced_when_ray_ranks_differ() -> None:
    """The webhook lists host 0's chips, then host 1's; Ray interleaved the ranks. torch_tpu
    takes entry RANK, so rank 1 would listen on host 0's entry: the bridge's list is used,
    with the webhook's host names and base port 8471."""
    hosts = "workers-0-0.park-train-headless,workers-0-1.park-train-headless"
    injected = ",".join(f"{h}:{8471 + c}" for h in hosts.split(",") for c in range(2))
    workers = _webhook(_v6_workers(hostnames=True), "2,2,1", injected)
    plan = plan_slice_env(workers, torch_tpu_topology="2,2,1")
    addresses = plan.env[0]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert addresses == [
        "workers-0-0.park-train-headless:8471",
        "workers-0-1.park-train-headless:8471",
        "workers-0-0.park-train-headless:8472",
        "workers-0-1.park-train-headless:8472",
    ]
    assert any("not the webhook's list: entry 1" in n and "base port 8471" in n for n in plan.notes)
    # Had Ray numbered them host-major, the injected list would have been kept.
    ordered = sorted(workers, key=lambda w: (w.node_ip, w.local_rank))
    host_major = [replace_rank(w, r) for r, w in enumerate(ordered)]
    kept = plan_slice_env(host_major, torch_tpu_topology="2,2,1")
    assert kept.env[1]["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == injected


def replace_rank(worker: WorkerInfo, rank: int) -> WorkerInfo:
    from dataclasses import replace

    return replace(worker, rank=rank)


def test_a_webhook_topology_that_disagrees_stops_the_run() -> None:
    workers = _webhook(_slice_workers(1, 8), "4,4,1", WEBHOOK_V6E_8)
    with pytest.raises(BridgeError, match=r"came with TORCH_TPU_TOPOLOGY \['4,4,1'\].*2,4,1"):
        plan_slice_env(workers, torch_tpu_topology="2,4,1")


def test_an_unparseable_webhook_list_is_replaced() -> None:
    workers = _webhook(_slice_workers(1, 2), "2,1,1", "[fd00::1]:8471,[fd00::1]:8472")
    plan = plan_slice_env(workers, torch_tpu_topology="2,1,1")
    assert plan.env[0]["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "localhost:8070,localhost:8071"
    assert any("is not host:port as torch_tpu parses it" in n for n in plan.notes)


# ---- ScalingConfig and TorchConfig of the TPU path ------------------------------------------


def test_4x4_is_one_slice_of_16_single_chip_workers() -> None:
    cfg = resolve(parse_args(TPU_4X4), {})
    scaling = build_scaling_config(cfg)

    assert scaling.num_workers == 16
    assert scaling.use_tpu is True
    assert scaling.topology == "4x4"
    assert scaling.accelerator_type == "TPU-V6E"
    assert scaling.resources_per_worker == {"TPU": 1}
    assert (
        get_tpu_num_slices_for_workers(
            topology="4x4",
            accelerator_type="TPU-V6E",
            num_workers=16,
            resources_per_worker=scaling.resources_per_worker,
        )
        == 1
    )
    # What the explicit resources prevent: Ray's default (a host per worker) asks for 4 slices.
    assert (
        get_tpu_num_slices_for_workers(topology="4x4", accelerator_type="TPU-V6E", num_workers=16)
        == 4
    )


def test_two_slices_of_4x4() -> None:
    cfg = resolve(parse_args([*TPU_4X4, "--num-slices", "2"]), {})
    scaling = build_scaling_config(cfg)
    assert scaling.num_workers == 32
    assert (
        get_tpu_num_slices_for_workers(
            topology="4x4",
            accelerator_type="TPU-V6E",
            num_workers=32,
            resources_per_worker=scaling.resources_per_worker,
        )
        == 2
    )
    torch_config = build_torch_config(cfg)
    assert isinstance(torch_config, TorchTPUConfig)
    assert (torch_config.num_slices, torch_config.torch_tpu_topology) == (2, "4,4,1")


def test_torch_configs_per_accelerator() -> None:
    tpu = build_torch_config(resolve(parse_args(TPU_4X4), {}))
    assert isinstance(tpu, TorchTPUConfig) and tpu.backend == "tpu_dist"
    gpu = build_torch_config(resolve(parse_args(["--accelerator", "gpu"]), {"GPU": 2}))
    assert gpu.backend == "nccl" and not isinstance(gpu, TorchTPUConfig)
    cpu_cfg = resolve(
        parse_args(["--accelerator", "cpu", "--num-workers", "3", "--global-batch-size", "6"]), {}
    )
    assert build_torch_config(cpu_cfg).backend == "gloo"
    cpu = build_scaling_config(cpu_cfg)
    assert (cpu.num_workers, cpu.use_gpu, cpu.use_tpu) == (3, False, False)
    assert build_scaling_config(resolve(parse_args(["--accelerator", "gpu"]), {"GPU": 2})).use_gpu


def test_base_port_follows_the_rayjobs_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_TPU_BASE_PORT", "9100")
    config = build_torch_config(resolve(parse_args(TPU_4X4), {}))
    assert config.base_port == 9100
    monkeypatch.delenv("TORCH_TPU_BASE_PORT")
    assert build_torch_config(resolve(parse_args(TPU_4X4), {})).base_port == 8070
