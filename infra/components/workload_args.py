"""The Ray workloads' typed arguments (the package's and the provider schema's view of them)
and how a component turns them into the stack section its rules read."""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import pulumi

from infra.components._args import KubeconfigArgs, TrainingArgs
from infra.components._args import TpuPoolRefArgs as TpuPoolRefArgs
from infra.components._base import site_values, stack_values
from infra.components._handles import BucketRef, NamespaceRef, NodeSelectorRef, PoolRef
from infra.components._posture import ACKNOWLEDGE_FIELD
from infra.components._types import ServingEngineArg, UpgradeStrategyArg


class _RayWorkloadArgs(KubeconfigArgs):
    """What both Ray workloads take: where they run and what their pods use (a base: its
    subclasses' schema descriptions come from here, park_gke.provider.schema)."""

    project: str
    """The GCP project."""
    location: str
    """The cluster's zone."""
    pool: PoolRef
    """The TPU pool it runs on (in Python, the TpuSlicePool itself)."""
    stack: NotRequired[str]
    """Names derive from it (KSA, bucket, registry); default: the Pulumi stack's name."""
    namespace: NotRequired[NamespaceRef]
    """The Ray pods' namespace (default park; in Python, the Workspace itself)."""
    bucket: NotRequired[BucketRef]
    """The bucket the pods mount (default <project>-<stack>-park; in Python, the Storage
    itself)."""
    head_node_selector: NotRequired[NodeSelectorRef]
    """Node labels the Ray head (and a RayJob's submitter) must run on: CpuPool.node_selector
    (in Python, the CpuPool itself). Default: none, any untainted node (an existing cluster's
    own pools)."""
    mount_path: NotRequired[str]
    """Where Ray pods see the bucket (GCS FUSE). Default: /data."""
    tpu_metrics: NotRequired[bool]
    """TPU chip metrics (`ray_tpu_*`, from the TPU device plugin). Default: true."""


class RayTrainingJobArgs(_RayWorkloadArgs):
    """A training RayJob: TorchTrainer, one Ray worker per chip, on `num_slices` slices."""

    image: NotRequired[pulumi.Input[str]]
    """Image; default: park-workloads, built from this checkout by `pulumi up`."""
    training: TrainingArgs
    """park:training's settings, typed (README's config reference); the pool and the image
    are the component's own arguments."""
    hf_token: NotRequired[bool]
    """The workspace holds an HF token Secret (Workspace.hf_token): the pods read it (a gated
    base model)."""


class ServedModelArgs(TypedDict):
    """One model of the OpenAI endpoint."""

    name: str
    """OpenAI model id clients ask for."""
    source: pulumi.Input[str]
    """HF id, gs://..., or a path under the bucket mount (RayTrainingJob.export_path: serve
    what a training run exported). An Output (such as export_path) is copied into the serve
    config once known: give `base_model` so its facts are checked at preview; a hub id must be
    known at preview (it is staged)."""
    base_model: NotRequired[str]
    """The model a fine-tuned source was trained from: its facts (architecture, size) stand in for
    the source's at preview, when its config cannot be read then (a run not yet done)."""
    tensor_parallel_size: NotRequired[int]
    """Default: every chip of one slice."""
    max_model_len: NotRequired[int]
    """Context length. Default: 8192."""
    enable_expert_parallel: NotRequired[bool]
    """For MoE models. Default: false."""
    min_replicas: NotRequired[int]
    """Serve autoscaling minimum; each replica holds a whole slice. Default: 1."""
    max_replicas: NotRequired[int]
    """Serve autoscaling maximum. Default: 1."""
    engine_kwargs: NotRequired[dict[str, Any]]
    """Other vLLM engine arguments."""


class LlmServiceArgs(_RayWorkloadArgs):
    """An OpenAI-compatible endpoint: vLLM through Ray Serve LLM, tensor parallel on a slice."""

    image: NotRequired[pulumi.Input[str]]
    """Image; default: the engine's, built from this checkout by `pulumi up`."""
    models: list[ServedModelArgs]
    """Served models."""
    engine: NotRequired[ServingEngineArg]
    """`vllm-torchtpu` or `vllm-tpu` (JAX; separate image). Default: vllm-torchtpu."""
    upgrade_strategy: NotRequired[UpgradeStrategyArg]
    """`None` (in place), `NewCluster` (blue/green: twice the slices) or
    `NewClusterWithIncrementalUpgrade`. Default: None."""
    expose_publicly: NotRequired[bool]
    """A LoadBalancer for the OpenAI endpoint (else a ClusterIP Service). Default: false."""
    acknowledge_public: NotRequired[list[str]]
    """Exposures meant to be public (serving), as park:policy.acknowledgePublic: on a
    production (prod*) stack a public endpoint is refused unless named here; elsewhere a
    warning."""
    endpoint_service: NotRequired[str]
    """The Kubernetes Service of the OpenAI endpoint (default <name>-openai)."""
    hf_token: NotRequired[bool]
    """The workspace holds an HF token Secret (Workspace.hf_token): the pods read it."""


def workload_values(args: Mapping[str, Any], section: str, body: dict[str, Any]) -> dict[str, Any]:
    """A workload's arguments as the stack values its rules read (`park:<section>` and the pool,
    bucket, zone and posture keys it implies)."""
    pool = {
        "name": args["pool"]["name"],
        "machineType": args["pool"]["machine_type"],
        "topology": args["pool"]["topology"],
        **stack_values(args["pool"], "slices", "capacity", "reservation", "ladder"),
    }
    values: dict[str, Any] = {
        **site_values(args["project"], args["location"]),
        "park:tpuPools": [pool],
        f"park:{section}": {"enabled": True, "pool": pool["name"], **body},
        "park:storage": stack_values(args, "bucket", "mount_path"),
        "park:observability": stack_values(args, "tpu_metrics"),
        # posture: infra.components._posture
        "park:policy": stack_values(args, "acknowledge_public"),
    }
    if args.get("namespace"):
        values["park:namespace"] = args["namespace"]
    return values


def workload_fields(section: str, argument: str) -> list[tuple[str, str]]:
    """Which argument each stack key of `workload_values` came from (for the messages)."""
    return [
        (f"park:{section}.", argument),
        ("park:tpuPools[0].", "pool."),
        ("park:storage.", ""),
        ("park:zone", "location"),
        ("park:namespace", "namespace"),
        ("park:hfToken", "hf_token"),
        ACKNOWLEDGE_FIELD,
    ]
