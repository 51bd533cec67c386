"""park:rl's RayJob as a component of the stack program: the learner and the rollout engines
on their own pools, in one Ray cluster (infra/plan/rl.py).

It is built from its piece of the stack program's resolved plan only (`of_plan`), not yet from
a typed argument set of the published package: the RL job spans two pools, a TPU one and a TPU
or GPU one, which the package's one-pool workload arguments do not describe."""

from __future__ import annotations

import pulumi

from infra.components._base import Component
from infra.components.kubernetes import custom_resource
from infra.components.workloads import with_image
from infra.plan.ray.pods import RayPods
from infra.plan.rl import rl_rayjob
from infra.resolve.types import RlPlan


class RayRlJob(Component):
    """The RL RayJob: runs to completion on both pools' slices, then releases them."""

    job_name: pulumi.Output[str]
    """The RayJob's name."""
    export_path: pulumi.Output[str]
    """gs:// folder of the final policy's Hugging Face export (empty when it exports none)."""

    @classmethod
    def of_plan(
        cls,
        name: str,
        rl: RlPlan,
        pods: RayPods,
        hf_token: bool,
        image: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> RayRlJob:
        """The stack program's: its plan's RL job (infra.plan.rl), its pods running `image`."""
        self = cls.planned(name, opts)
        self._build(rl, pods, hf_token, image)
        return self

    def _build(self, rl: RlPlan, pods: RayPods, hf_token: bool, image: pulumi.Input[str]) -> None:
        manifest = rl_rayjob(rl, pods, hf_token=hf_token)
        # the image build's digest (an Output) where the plan names its tag
        manifest = with_image(manifest, rl.image, image)
        self.resource = custom_resource(
            manifest,
            self.child_options(),
            resource_name=f"{self._component_name}-rayjob",
            keep_name=True,
        )
        self.job_name = pulumi.Output.from_input(manifest["metadata"]["name"])
        self.export_path = pulumi.Output.from_input(rl.export_path or "")
        self.register()
        self._workload = manifest["metadata"]["name"]  # the workload label of its pods

    def as_argument(self, field: str) -> str | None:
        """Among a RayMetrics' `training_jobs`: the workload label its pods carry."""
        return self._workload if field == "training_jobs" else None
