"""Hub models staged into the bucket during `pulumi up`, before anything reads them.

One Kubernetes Job per model (infra/plan/staging.py), which pulumi-kubernetes awaits until it is
Complete within a bound from the model's size; a workload that reads a staged model depends on
its Job (`jobs_for`). A copy already complete (the stage module's marker) makes the Job a no-op,
and a Job left Failed is replaced on the next `pulumi up`.
"""

import copy
from collections.abc import Iterable
from typing import Any, NotRequired

import pulumi

from infra import model_facts, model_lookup
from infra.components._args import KubeconfigArgs
from infra.components._base import KubernetesComponent, bad_value, namespace_names
from infra.components._handles import BucketRef, NamespaceRef, NodeSelectorRef
from infra.components._naming import child_name
from infra.plan import staging
from infra.plan.ray.pods import RayPods
from infra.resolve import disk
from infra.schema.models import StorageConfig


class ModelStagingArgs(KubeconfigArgs):
    """Hugging Face hub models copied once into the stack's bucket, where the workloads read
    them through the bucket's mount (a served or trained hub id is read from there, never
    downloaded per host)."""

    project: str
    """The GCP project (the bucket's default name and the Workload Identity pool are its)."""
    models: list[str]
    """Hub ids to stage (`org/name`): each lands at `gs://<bucket>/models/<org>/<name>`."""
    image: pulumi.Input[str]
    """The image the Jobs run (a park-gke workload image: WorkloadImage.ref)."""
    stack: NotRequired[str]
    """Names derive from it (the KSA, the bucket); default: the Pulumi stack's name."""
    namespace: NotRequired[NamespaceRef]
    """The Jobs' namespace, the workloads' (default park; in Python, the Workspace itself)."""
    bucket: NotRequired[BucketRef]
    """The bucket (default <project>-<stack>-park; in Python, the Storage itself)."""
    node_selector: NotRequired[NodeSelectorRef]
    """Node labels the Jobs must run on (in Python, the CpuPool itself). Default: none."""
    hf_token: NotRequired[bool]
    """The workspace holds an HF token Secret (a gated model): the Jobs read it."""


class ModelStaging(KubernetesComponent):
    """One awaited Job per hub model, into the bucket the workloads read."""

    jobs: pulumi.Output[list[str]]
    """The Jobs' names, one per model."""

    def __init__(
        self, name: str, args: ModelStagingArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, ModelStagingArgs)
        bad = [m for m in args["models"] if not model_facts.is_hub_id(m)]
        if bad:
            self.refuse([bad_value("models", bad, "hub ids, org/name")])
        names = namespace_names(args)
        mount = StorageConfig().mount_path
        pods = RayPods(names.namespace, names.bucket, mount, names.workload_ksa)
        models = [
            disk.StagedModel(
                repo=repo,
                uri=disk.staged_uri(names.bucket, repo),
                path=disk.staged_path(mount, repo),
                weights_bytes=model_facts.weights_bytes(model_lookup.lookup(repo).facts),
                used_by=(f"args.models[{i}]",),
            )
            for i, repo in enumerate(args["models"])
        ]
        jobs = [  # planned with a stand-in image: the image may be an Output
            staging.stage_job(pods, m, "") for m in models
        ]
        self._build(jobs, args["image"], args.get("node_selector"))

    @classmethod
    def of_plan(
        cls,
        name: str,
        jobs: Iterable[staging.StageJob],
        image: pulumi.Input[str],
        node_selector: pulumi.Input[dict[str, str]] | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "ModelStaging":
        """The stack program's: its plan's Jobs (infra.plan.staging.stage_jobs), resolved once
        with the stack, their image the build's Output."""
        self = cls.planned(name, opts)
        self._build(list(jobs), image, node_selector)
        return self

    def _build(
        self,
        jobs: list[staging.StageJob],
        image: pulumi.Input[str],
        node_selector: Any,
    ) -> None:
        from pulumi_kubernetes.batch.v1 import Job

        taken = self.claim_objects([job.manifest for job in jobs])
        if taken:
            self.refuse(taken)
        self._jobs: dict[str, Job] = {}
        for job in jobs:
            manifest = copy.deepcopy(job.manifest)
            pod = manifest["spec"]["template"]["spec"]
            pod["containers"][0]["image"] = image
            pod.pop("nodeSelector", None)
            if node_selector is not None:
                pod["nodeSelector"] = node_selector
            self._jobs[job.model.repo] = Job(
                child_name(self._component_name, manifest["metadata"]["name"]),
                metadata=manifest["metadata"],
                spec=manifest["spec"],
                opts=pulumi.ResourceOptions.merge(
                    self.child_options(),
                    pulumi.ResourceOptions(
                        custom_timeouts=pulumi.CustomTimeouts(
                            create=f"{job.timeout_s}s", update=f"{job.timeout_s}s"
                        )
                    ),
                ),
            )
        self.jobs = pulumi.Output.from_input([j.manifest["metadata"]["name"] for j in jobs])
        self.register()

    def jobs_for(self, repos: Iterable[str | None]) -> list[pulumi.Resource]:
        """The Jobs that stage these models (what a workload reading them waits for)."""
        return [self._jobs[r] for r in repos if r is not None and r in self._jobs]
