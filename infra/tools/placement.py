"""What runs where on the cluster, as a Mermaid flowchart: the node pools (the CPU pool, each TPU
pool with its slices and hosts) and the pods each holds (KubeRay, Kueue, the Ray heads, the
training, serving and RL worker groups), and the bucket they all mount.

`resources.mmd` (infra/tools/flowchart.py) answers "what does `up` create, in which order";
this answers "where does each part of the workloads run", which a reader of the stack file
otherwise assembles from five sections. It reads the resolved plan, recomputing nothing: the
numbers (hosts, workers, TP, replicas) are the plan's.
"""

from __future__ import annotations

from infra.resolve import StackPlan
from infra.resolve.types import PoolPlan

HEADER = "%% What runs where on the cluster (park render: infra/tools/placement.py)"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _slice_label(pool: PoolPlan) -> str:
    shape = pool.slice
    per = f"{_count(shape.hosts, 'host')} x {shape.chips_per_host} chips"
    capacity = " then ".join(rung.capacity for rung in pool.rungs)  # a ladder, in Kueue's order
    return (
        f"TPU pool {pool.name}: {pool.slices} x {shape.ray_pod_type} "
        f"({shape.machine_type}, {per}), {capacity}"
    )


def _node(node_id: str, text: str) -> str:
    return f'    {node_id}["{text.replace(chr(34), chr(39))}"]'


def placement_chart(plan: StackPlan) -> str:
    """The Mermaid source (``flowchart LR``) of where each workload's pods run in `plan`."""
    spec = plan.spec
    lines = [HEADER, "flowchart LR"]
    edges: list[str] = []
    cpu = [_node("operator", f"KubeRay operator ({spec.kuberay.install})")]
    if plan.kueue_pools:
        cpu.append(_node("kueue", "Kueue controller: admits queued RayJobs"))
    on_pool: dict[str, list[str]] = {pool.name: [] for pool in plan.tpu_pools}

    def place(head: tuple[str, str] | None, pool: str, pods: tuple[str, str]) -> None:
        """A workload's head on the CPU pool, its pods on `pool`, an edge between them."""
        if head is not None:
            cpu.append(_node(*head))
            edges.append(f"    {head[0]} --> {pods[0]}")
        on_pool.setdefault(pool, []).append(_node(*pods))

    if (run := plan.training) is not None:
        workers = f"{run.workers} workers (one per device) in {_count(run.hosts, 'pod')}"
        place(
            ("train_head", "RayJob head: Ray Train controller, job driver"),
            run.pool.name,
            (
                "train_workers",
                f"Ray Train: {workers}, {_count(run.slices, 'slice')}, {run.spec.strategy}",
            ),
        )
    if (serving := plan.serving) is not None:
        models = ", ".join(f"{m.spec.name} TP {m.tensor_parallel}" for m in serving.models)
        low, high = serving.min_slices, serving.max_slices
        held = _count(low, "slice") if low == high else f"{low} to {high} slices"
        if serving.upgrade_clusters > 1:  # blue/green: a second cluster while upgrading
            held += f" ({serving.upgrade_clusters}x during an upgrade)"
        place(
            ("serve_head", "RayService head: Serve controller, HAProxy ingress"),
            serving.pool.name,
            ("serve_workers", f"vLLM replicas ({models}) on {held}"),
        )
    if (rl := plan.rl) is not None:
        learner = f"{rl.workers} Ray Train workers in {_count(rl.hosts, 'pod')}"
        place(
            ("rl_head", "RL RayJob head: GRPO driver"),
            rl.learner.name,
            ("rl_learner", f"GRPO learner: {learner}"),
        )
        rollout = rl.rollout
        engines = f"{_count(rollout.engines, 'vLLM engine')} of TP {rollout.tensor_parallel}"
        place(
            None,
            rollout.pool_name,
            (
                "rl_rollout",
                f"rollouts: {engines} in "
                f"{_count(rollout.hosts, 'pod')}, a weight receiver per host",
            ),
        )
        edges.append("    rl_head --> rl_rollout")
        edges.append("    rl_learner -. weights each step .-> rl_rollout")
    lines.append(f'  subgraph cpu["CPU pool: {spec.cpu_pool.machine_type}, system pods"]')
    lines += cpu
    lines.append("  end")
    for index, pool in enumerate(plan.tpu_pools):
        lines.append(f'  subgraph tpu{index}["{_slice_label(pool)}"]')
        lines += on_pool.pop(pool.name) or [_node(f"idle{index}", "nothing scheduled here")]
        lines.append("  end")
    for index, (name, pods) in enumerate(on_pool.items()):  # a GPU pool (RL rollouts)
        lines.append(f'  subgraph gpu{index}["GPU pool {name}"]')
        lines += pods
        lines.append("  end")
    bucket = plan.names.bucket
    lines.append(f'  bucket[("gs://{bucket}: models/, checkpoints/ (GCS FUSE in every pod)")]')
    present = "\n".join(lines)
    readers = ("train_workers", "serve_workers", "rl_learner", "rl_rollout")
    edges += [f"    {reader} --- bucket" for reader in readers if f"    {reader}[" in present]
    return "\n".join(lines + edges) + "\n"
