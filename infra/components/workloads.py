"""The Ray workloads: the training RayJob and the LLM RayService, from typed arguments.

Each is checked with the stack's rules (the TPU catalog, the engine's TP and memory rules, the
model's facts) before a manifest exists; give them a Kubernetes provider in their options.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from infra.components._args import TpuPoolRefArgs as TpuPoolRefArgs
from infra.components._base import (
    KubernetesComponent,
    name_problems,
    stack_of,
    stack_values,
)
from infra.components._naming import (
    claim,
    declared_pools,
    expect_cluster_pool,
    pool_ref_problems,
)
from infra.components.kubernetes import custom_resource
from infra.components.workload_args import (
    LlmServiceArgs,
    RayTrainingJobArgs,
    ServedModelArgs,
    workload_fields,
    workload_values,
)
from infra.names import APP_NAME_LABEL, WORKLOAD_LABEL, job_object_name
from infra.plan import ray as ray_plan
from infra.plan.ray.pods import RayPods
from infra.resolve import ServingPlan, StackPlan, TrainingPlan
from infra.rules import grammar


def _named(
    manifest: dict[str, Any], name: str, cluster: str, head: Any, pods: list[str]
) -> dict[str, Any]:
    """The planned workload under the component's name (object, app label, the workload label
    every pod carries), its head (and submitter) placed by `head` (None: no nodeSelector)."""
    old = manifest["metadata"]["name"]
    manifest["metadata"]["name"] = name
    labels = manifest["metadata"].setdefault("labels", {})
    if labels.get(APP_NAME_LABEL) == old:
        labels[APP_NAME_LABEL] = name
    spec = manifest["spec"][cluster]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        group["template"]["metadata"].setdefault("labels", {})[WORKLOAD_LABEL] = name
    for path in pods:
        pod = manifest["spec"]
        for key in path.split("."):
            pod = pod[key]
        pod.pop("nodeSelector", None)
        if head is not None:
            pod["nodeSelector"] = head
    return manifest


def with_image(manifest: dict[str, Any], planned: str, image: Any) -> dict[str, Any]:
    """The manifest with every container that runs the planned image running `image` instead
    (an Output, such as WorkloadImage.ref: a value only copied into the pods)."""
    if image is None or isinstance(image, str):
        return manifest

    def swap(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: image if k == "image" and v == planned else swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    swapped: dict[str, Any] = swap(manifest)
    return swapped


# Where a model whose source is an Output is planned: a path under the mount nothing else uses.
PENDING_SOURCE = "/.park-pending-source"


def _pending_source(index: int) -> str:
    return f"{PENDING_SOURCE}-{index}"


def _serve_config_when_known(
    serving: ServingPlan, pods: RayPods, later: dict[int, Any]
) -> pulumi.Output[str]:
    """serveConfigV2 with each Output source in place, rendered by the plan's own function."""
    import dataclasses

    import yaml

    from infra.resolve import disk

    order = sorted(later)

    def render(sources: list[Any]) -> str:
        known = {index: str(source or "") for index, source in zip(order, sources, strict=True)}
        for index, source in known.items():
            if disk.needs_staging(source):
                # Known only now, so it was not staged with the stack: said, not raised (an
                # exception here would surface as a serialization error of the whole spec).
                pulumi.log.warn(
                    f"models[{index}].source = {source!r}: a hub id, read from the bucket's "
                    f"{disk.MODELS_PREFIX}/ folder: stage it there (ModelStaging), or pass "
                    "it as a string"
                )
        models = tuple(
            dataclasses.replace(m, source=known[m.index]) if m.index in known else m
            for m in serving.models
        )
        config = ray_plan.serve_config(dataclasses.replace(serving, models=models), pods)
        return yaml.safe_dump(config, sort_keys=False)

    return pulumi.Output.all(*(later[i] for i in order)).apply(render)


@dataclass(frozen=True)
class RayRun:
    """How a workload's Ray pods run, the same for both workloads of a stack: the pods' plan,
    whether the Workspace holds an HF token, and where the Ray head goes (None: no
    nodeSelector)."""

    pods: RayPods
    hf_token: bool
    head_node_selector: pulumi.Input[dict[str, str]] | None


class _Workload(KubernetesComponent):
    """What both workloads share: the one-pool stack they stand for, and their planned Ray
    object created under the component's name once every object it makes is claimed."""

    @staticmethod
    def run_of(plan: StackPlan, args: Mapping[str, Any]) -> RayRun:
        """The public edge's RayRun: the pods of the one-pool stack it planned."""
        return RayRun(
            ray_plan.ray_pods(plan), bool(args.get("hf_token")), args.get("head_node_selector")
        )

    def placed(
        self,
        manifest: dict[str, Any],
        run: RayRun,
        cluster: str,
        pods: list[str],
        planned_image: str,
        image: Any,
    ) -> dict[str, Any]:
        """The planned Ray object under the component's name, its head placed (_named), its
        containers running `image` where the plan names `planned_image` (with_image)."""
        named = _named(manifest, self._component_name, cluster, run.head_node_selector, pods)
        return with_image(named, planned_image, image)

    def workload_plan(
        self, args: Mapping[str, Any], section: str, body: dict[str, Any], argument: str
    ) -> StackPlan:
        """The one-pool stack the component stands for, checked with the stack's rules
        (problems named by the component's arguments) and resolved: the stack program's plan,
        in it."""
        name = self._component_name
        wrong = grammar.dns1035_label_problem(name, grammar.KUBERAY_NAME_MAX)
        if wrong:
            self.refuse([f"the name {name!r} names its Kubernetes objects: not {wrong}"])
        checks: dict[str, Any] = {"endpoint_service": grammar.dns1035_label_problem}
        found = name_problems(args, checks)
        selector = args.get("head_node_selector")
        found += [
            f"args.head_node_selector: {p}" for p in grammar.labels_problems(selector, "label")
        ]
        found += pool_ref_problems("pool", dict(args["pool"]))
        if found:
            self.refuse(found)
        if not declared_pools():  # an existing cluster's pool: checked when it answers
            expect_cluster_pool(self.owner, "pool", dict(args["pool"]))
        values = workload_values(args, section, body)
        if args.get("hf_token"):
            values["park:hfToken"] = "[secret]"  # set, not known: the Workspace holds the token
        return self.plan(values, workload_fields(section, argument), stack=stack_of(args))

    def claimed(self, objects: list[dict[str, Any]]) -> None:
        taken = self.claim_objects(objects)
        if taken:
            self.refuse(taken)

    def create(self, manifest: dict[str, Any]) -> Any:
        """The Ray object as the child ``<name>-<kind>``."""
        resource_name = f"{self._component_name}-{manifest['kind'].lower()}"
        return custom_resource(
            manifest, self.child_options(), resource_name=resource_name, keep_name=self._of_plan
        )


class RayTrainingJob(_Workload):
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
        super().__init__(name, opts)
        args = self.checked(args, RayTrainingJobArgs)
        body = stack_values(args["training"], *args["training"])  # stack-file (camelCase) keys
        image = args.get("image")
        if isinstance(image, str) and image:
            body["image"] = image  # planned (and checked) as the stack's park:training.image
        plan = self.workload_plan(args, "training", body, "training.")
        assert plan.training is not None
        self._build(plan.training, self.run_of(plan, args), image, plan.spec.stack)

    @classmethod
    def of_plan(
        cls,
        name: str,
        training: TrainingPlan,
        run: RayRun,
        image: pulumi.Input[str],
        stack: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "RayTrainingJob":
        """The stack program's: its plan's training job (infra.plan.ray.rayjob), its head on
        `run.head_node_selector`, its pods running `image` (the build's digest)."""
        self = cls.planned(name, opts)
        self._build(training, run, image, stack)
        return self

    def _build(self, training: TrainingPlan, run: RayRun, image: Any, stack: str) -> None:
        name = self._component_name
        manifest = self.placed(
            ray_plan.rayjob(training, run.pods, hf_token=run.hf_token),
            run,
            "rayClusterSpec",
            ["rayClusterSpec.headGroupSpec.template.spec", "submitterPodTemplate.spec"],
            training.image,
            image,
        )
        manifest["metadata"]["name"] = job_object_name(name, training.spec.run_id)
        self.claimed([manifest])
        # Two jobs of one stack would write one run folder (checkpoints, export): one owner.
        folder = f"training run folder {training.run_name} in gs://{run.pods.bucket}"
        taken = claim(self.owner, folder, ())
        if taken:
            self.refuse([f"args.stack = {stack!r}: {taken} (runs are named per stack)"])
        self.resource = self.create(manifest)
        self.job_name = pulumi.Output.from_input(manifest["metadata"]["name"])
        self.workers = pulumi.Output.from_input(training.workers)
        self.export_path = pulumi.Output.from_input(training.export_path or "")
        self.register()
        self._workload = name

    def as_argument(self, field: str) -> str | None:
        """Among a RayMetrics' `training_jobs`: the workload label its pods carry."""
        return self._workload if field == "training_jobs" else None


class LlmService(_Workload):
    """The serving RayService: Ray Serve LLM's OpenAI app, one LLMConfig per model."""

    service_name: pulumi.Output[str]
    """The RayService's name."""
    endpoint_service: pulumi.Output[str]
    """The Kubernetes Service of the OpenAI endpoint (port 8000, path /v1)."""

    def __init__(self, name: str, args: LlmServiceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, LlmServiceArgs)
        # Sources known only once deployed (an Output: a training run's export_path) are
        # planned as a stand-in path and copied into the serve config when known.
        later = {
            i: m["source"] for i, m in enumerate(args["models"]) if not isinstance(m["source"], str)
        }
        models = [
            {
                **stack_values(m, *ServedModelArgs.__annotations__),
                **({"source": _pending_source(i)} if i in later else {}),
            }
            for i, m in enumerate(args["models"])
        ]
        image = args.get("image")
        body: dict[str, Any] = {
            "models": models,
            **stack_values(args, "engine", "upgrade_strategy", "expose_publicly"),
            **({"image": image} if isinstance(image, str) and image else {}),
        }
        plan = self.workload_plan(args, "serving", body, "")
        assert plan.serving is not None
        endpoint_service = args.get("endpoint_service") or f"{name}-openai"
        self._build(plan.serving, self.run_of(plan, args), image, endpoint_service, later)

    @classmethod
    def of_plan(
        cls,
        name: str,
        serving: ServingPlan,
        run: RayRun,
        image: pulumi.Input[str],
        endpoint_service: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "LlmService":
        """The stack program's: its plan's RayService (infra.plan.ray.rayservice), its head
        on `run.head_node_selector`, its pods running `image` (the build's digest)."""
        self = cls.planned(name, opts)
        self._build(serving, run, image, endpoint_service, {})
        return self

    def _build(
        self,
        serving: ServingPlan,
        run: RayRun,
        image: Any,
        endpoint_service: str,
        later: dict[int, Any],
    ) -> None:
        name = self._component_name
        manifest = self.placed(
            ray_plan.rayservice(serving, run.pods, hf_token=run.hf_token),
            run,
            "rayClusterConfig",
            ["rayClusterConfig.headGroupSpec.template.spec"],
            serving.image,
            image,
        )
        if later:
            manifest["spec"]["serveConfigV2"] = _serve_config_when_known(serving, run.pods, later)
        endpoint = manifest["spec"]["serveService"]["metadata"]
        endpoint["name"] = endpoint_service
        service = {"kind": "Service", "metadata": {**endpoint, "namespace": run.pods.namespace}}
        self.claimed([manifest, service])
        self.resource = self.create(manifest)
        self.service_name = pulumi.Output.from_input(manifest["metadata"]["name"])
        self.endpoint_service = pulumi.Output.from_input(endpoint["name"])
        self.register()
        self._service = name

    def as_argument(self, field: str) -> str | None:
        """Given as a DashboardAccess's `service` or among a RayMetrics' `services`: the
        workload label its pods carry (the RayService's name)."""
        return self._service if field in ("service", "services") else None
