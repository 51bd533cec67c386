"""The Ray workloads: the training RayJob and the LLM RayService, from typed arguments.

Each is checked with the stack's rules (the TPU catalog, the engine's TP and memory rules, the
model's facts) before a manifest exists; give them a Kubernetes provider in their options.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import pulumi

from infra.components._base import (
    TYPE_PREFIX,
    checked_plan,
    child_options,
    plain,
    region_of,
    require,
    use_kubeconfig,
)
from infra.components.kubernetes import custom_resource
from infra.plan import ray as ray_plan
from infra.resolve import StackPlan


class TpuPoolRefArgs(TypedDict):
    """The TPU pool a workload runs on (a TpuSlicePool's arguments, or an existing pool's)."""

    name: str
    """The pool's name: its nodes carry the label park-gke/pool=<name>."""
    machine_type: str
    """ct6e-standard-1t, -4t or -8t."""
    topology: str
    """The slice topology, e.g. 4x4."""
    slices: NotRequired[int]
    """Slices the pool has (default 1)."""
    capacity: NotRequired[str]
    """on-demand (default), spot, reservation, flex-start or queued."""
    reservation: NotRequired[str]
    """Reservation name (capacity reservation only)."""


# The two workloads' arguments repeat their common fields rather than inherit them: Pulumi's
# schema analyzer reads a field's description only from the class that declares it.


class RayTrainingJobArgs(TypedDict):
    """A training RayJob: TorchTrainer, one Ray worker per chip, on `num_slices` slices."""

    project: str
    """The GCP project."""
    location: str
    """The cluster's zone."""
    pool: TpuPoolRefArgs
    """The TPU pool it runs on."""
    stack: NotRequired[str]
    """Names derive from it (KSA, bucket, registry); default: the component's name."""
    namespace: NotRequired[str]
    """The Ray pods' namespace (default park)."""
    bucket: NotRequired[str]
    """The bucket the pods mount (default <project>-<stack>-park)."""
    mount_path: NotRequired[str]
    """Where the pods see it (default /data)."""
    image: NotRequired[str]
    """The image (default park-workloads in the stack's registry)."""
    tpu_metrics: NotRequired[bool]
    """TPU chip metrics from the device plugin (default true)."""
    training: dict[str, Any]
    """park:training's keys (camelCase, as in a stack file: strategy, steps, globalBatchSize,
    ...; see README's config reference); `pool` and `enabled` are set from the arguments."""
    hf_token: NotRequired[bool]
    """The workspace holds an HF token Secret (Workspace.hf_token): the pods read it (a gated
    base model)."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """A kubeconfig (Cluster.kubeconfig or ExistingCluster.kubeconfig) for a Kubernetes provider
    of its own; unset: the provider in its options (providers={"kubernetes": ...})."""


class ServedModelArgs(TypedDict):
    """One model of the OpenAI endpoint."""

    name: str
    """The model id clients ask for."""
    source: str
    """HF id, gs://..., or a path under the bucket mount (RayTrainingJob.export_path: serve
    what a training run exported)."""
    base_model: NotRequired[str]
    """The model a fine-tuned source was trained from: its facts (architecture, size) stand in
    for the source's at preview, when its config cannot be read then (a run not yet done)."""
    tensor_parallel_size: NotRequired[int]
    """Default: every chip of one slice."""
    max_model_len: NotRequired[int]
    """Context length (default 8192)."""
    enable_expert_parallel: NotRequired[bool]
    """For MoE models."""
    min_replicas: NotRequired[int]
    """Serve autoscaling minimum (default 1); each replica holds a whole slice."""
    max_replicas: NotRequired[int]
    """Serve autoscaling maximum (default 1)."""
    engine_kwargs: NotRequired[dict[str, Any]]
    """Other vLLM engine arguments."""


class LlmServiceArgs(TypedDict):
    """An OpenAI-compatible endpoint: vLLM through Ray Serve LLM, tensor parallel on a slice."""

    project: str
    """The GCP project."""
    location: str
    """The cluster's zone."""
    pool: TpuPoolRefArgs
    """The TPU pool it runs on."""
    stack: NotRequired[str]
    """Names derive from it (KSA, bucket, registry); default: the component's name."""
    namespace: NotRequired[str]
    """The Ray pods' namespace (default park)."""
    bucket: NotRequired[str]
    """The bucket the pods mount (default <project>-<stack>-park)."""
    mount_path: NotRequired[str]
    """Where the pods see it (default /data)."""
    image: NotRequired[str]
    """The image (default park-workloads in the stack's registry)."""
    tpu_metrics: NotRequired[bool]
    """TPU chip metrics from the device plugin (default true)."""
    models: list[ServedModelArgs]
    """The served models."""
    engine: NotRequired[str]
    """vllm-torchtpu (default) or vllm-tpu (JAX)."""
    upgrade_strategy: NotRequired[str]
    """None (in place, default), NewCluster (blue/green: twice the slices) or
    NewClusterWithIncrementalUpgrade."""
    expose_publicly: NotRequired[bool]
    """A LoadBalancer for the endpoint (default ClusterIP)."""
    hf_token: NotRequired[bool]
    """The workspace holds an HF token Secret (Workspace.hf_token): the pods read it."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """A kubeconfig (Cluster.kubeconfig or ExistingCluster.kubeconfig) for a Kubernetes provider
    of its own; unset: the provider in its options (providers={"kubernetes": ...})."""


def _values(args: Mapping[str, Any], section: str, body: dict[str, Any]) -> dict[str, Any]:
    pool = {
        "name": args["pool"]["name"],
        "machineType": args["pool"]["machine_type"],
        "topology": args["pool"]["topology"],
        **plain(args["pool"], "slices", "capacity", "reservation"),
    }
    values: dict[str, Any] = {
        "gcp:project": args["project"],
        "gcp:region": region_of(args["location"]),
        "park:zone": args["location"],
        "park:tpuPools": [pool],
        f"park:{section}": {"enabled": True, "pool": pool["name"], **body},
        "park:storage": plain(args, "bucket", "mount_path"),
        "park:observability": plain(args, "tpu_metrics"),
    }
    if args.get("namespace"):
        values["park:namespace"] = args["namespace"]
    return values


def _fields(section: str, argument: str) -> list[tuple[str, str]]:
    return [
        (f"park:{section}.", argument),
        ("park:tpuPools[0].", "pool."),
        ("park:storage.", ""),
        ("park:zone", "location"),
        ("park:namespace", "namespace"),
        ("park:hfToken", "hf_token"),
    ]


def _workload_plan(
    component: str,
    name: str,
    args: Mapping[str, Any],
    section: str,
    body: dict[str, Any],
    argument: str,
) -> StackPlan:
    """The one-pool stack a workload component stands for, checked with the stack's rules
    (problems named by the component's arguments) and resolved."""
    values = _values(args, section, body)
    if args.get("hf_token"):
        values["park:hfToken"] = "[secret]"  # set, not known: the Workspace holds the token
    return checked_plan(
        component, name, values, _fields(section, argument), stack=args.get("stack") or name
    )


class RayTrainingJob(pulumi.ComponentResource):
    """The training RayJob: runs to completion on its slices, then releases them."""

    job_name: pulumi.Output[str]
    """The RayJob's name."""
    workers: pulumi.Output[int]
    """Ray Train workers: one per chip of its slices."""
    export_path: pulumi.Output[str]
    """gs:// folder of the run's final Hugging Face export (empty when it exports none): an
    LlmService model's source."""

    def __init__(
        self, name: str, args: RayTrainingJobArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(TYPE_PREFIX + "RayTrainingJob", name, None, opts)
        require("RayTrainingJob", name, args, "project", "location", "pool", "training")
        use_kubeconfig(self, name, args)
        body = {k: v for k, v in args["training"].items() if k not in ("enabled", "pool")}
        if args.get("image"):
            body["image"] = args["image"]
        plan = _workload_plan("RayTrainingJob", name, args, "training", body, "training.")
        assert plan.training is not None
        manifest = ray_plan.rayjob(
            plan.training, ray_plan.ray_pods(plan), hf_token=bool(args.get("hf_token"))
        )
        self.resource = custom_resource(
            manifest, child_options(self, opts), resource_name=f"{name}-rayjob"
        )
        self.job_name = pulumi.Output.from_input(manifest["metadata"]["name"])
        self.workers = pulumi.Output.from_input(plan.training.workers)
        self.export_path = pulumi.Output.from_input(plan.training.export_path or "")
        self.register_outputs(
            {"job_name": self.job_name, "workers": self.workers, "export_path": self.export_path}
        )


class LlmService(pulumi.ComponentResource):
    """The serving RayService: Ray Serve LLM's OpenAI app, one LLMConfig per model."""

    service_name: pulumi.Output[str]
    """The RayService's name."""
    endpoint_service: pulumi.Output[str]
    """The Kubernetes Service of the OpenAI endpoint (port 8000, path /v1)."""

    def __init__(self, name: str, args: LlmServiceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TYPE_PREFIX + "LlmService", name, None, opts)
        require("LlmService", name, args, "project", "location", "pool", "models")
        use_kubeconfig(self, name, args)
        models = [
            {
                **plain(
                    m,
                    "name",
                    "source",
                    "base_model",
                    "tensor_parallel_size",
                    "max_model_len",
                    "enable_expert_parallel",
                    "min_replicas",
                    "max_replicas",
                ),
                **({"engineKwargs": dict(m["engine_kwargs"])} if m.get("engine_kwargs") else {}),
            }
            for m in args["models"]
        ]
        body: dict[str, Any] = {
            "models": models,
            **plain(args, "engine", "upgrade_strategy", "expose_publicly", "image"),
        }
        plan = _workload_plan("LlmService", name, args, "serving", body, "")
        assert plan.serving is not None
        manifest = ray_plan.rayservice(
            plan.serving, ray_plan.ray_pods(plan), hf_token=bool(args.get("hf_token"))
        )
        self.resource = custom_resource(
            manifest, child_options(self, opts), resource_name=f"{name}-rayservice"
        )
        self.service_name = pulumi.Output.from_input(manifest["metadata"]["name"])
        self.endpoint_service = pulumi.Output.from_input(
            manifest["spec"]["serveService"]["metadata"]["name"]
        )
        self.register_outputs(
            {"service_name": self.service_name, "endpoint_service": self.endpoint_service}
        )
