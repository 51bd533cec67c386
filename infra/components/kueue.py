"""Kueue for queued (DWS) and laddered TPU capacity: the Helm release, then its objects (CRDs
come first)."""

from typing import Any, NotRequired

import pulumi

from infra.components._args import KubeconfigArgs, TpuPoolRefArgs
from infra.components._base import PART_STACK, KubernetesComponent, site_values
from infra.components._naming import pool_ref_problems
from infra.components.gates import GateRun, gated
from infra.components.kubernetes import custom_resource, helm_release
from infra.plan import kueue
from infra.plan.operator import HelmReleasePlan


class KueueArgs(KubeconfigArgs):
    """Kueue and, per queued or laddered TPU pool, a ResourceFlavor per rung, a ClusterQueue
    walking them in order and a LocalQueue, with the DWS (ProvisioningRequest) admission check
    on a queued rung."""

    queued_pools: list[TpuPoolRefArgs]
    """The pools with capacity queued or a ladder; jobs name a pool's LocalQueue (its name)."""
    namespace: NotRequired[str]
    """Kubernetes namespace of the Ray workloads. Default: park."""
    version: NotRequired[str]
    """Kueue Helm chart version (OCI, registry.k8s.io). Default: 0.19.2."""


class Kueue(KubernetesComponent):
    """Kueue at the pinned chart version and the queues of the queued TPU pools."""

    local_queues: pulumi.Output[list[str]]
    """The LocalQueues jobs name in their kueue.x-k8s.io/queue-name label."""

    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, KueueArgs)
        refs = [
            ref if ref.get("ladder") else {**ref, "capacity": ref.get("capacity", "queued")}
            for ref in args["queued_pools"]
        ]
        wrong = [
            problem
            for i, ref in enumerate(refs)
            for problem in pool_ref_problems(f"queued_pools[{i}]", ref)
        ]
        if wrong:
            self.refuse(wrong)
        pools = [
            {
                "name": p["name"],
                "machineType": p["machine_type"],
                "topology": p["topology"],
                "slices": p.get("slices", 1),
                **(
                    {"ladder": p["ladder"]}  # the rungs' own (snake_case) keys read as well
                    if p.get("ladder")
                    else {"capacity": "queued"}
                ),
            }
            for p in refs
        ]
        values = {
            **site_values("project", "us-east5-b"),
            "park:extraTpuZones": ["us-east5-b"],
            "park:tpuPools": pools,
            "park:kueue": {"version": args["version"]} if args.get("version") else {},
        }
        if args.get("namespace"):
            values["park:namespace"] = args["namespace"]
        fields = [
            ("park:tpuPools", "queued_pools"),
            ("park:kueue.", ""),
            ("park:namespace", "namespace"),
        ]
        plan = self.plan(values, fields, stack=PART_STACK)
        self._build(kueue.helm_release(plan), kueue.manifests(plan))

    @classmethod
    def of_plan(
        cls,
        name: str,
        release: HelmReleasePlan | None,
        manifests: list[dict[str, Any]],
        opts: pulumi.ResourceOptions | None = None,
        gate: GateRun | None = None,
    ) -> "Kueue":
        """The stack program's: its plan's Kueue release and queues (infra.plan.kueue), the
        queues after `gate` (Kueue's webhook answering: infra.plan.gates)."""
        self = cls.planned(name, opts)
        self._build(release, manifests, gate)
        return self

    def _build(
        self,
        release_plan: HelmReleasePlan | None,
        manifests: list[dict[str, Any]],
        gate: GateRun | None = None,
    ) -> None:
        name = self._component_name
        self.ready: list[pulumi.Resource] = []
        release_object = (
            [{"kind": "Helm release", "metadata": {"name": release_plan.name}}]
            if release_plan is not None
            else []
        )
        taken = self.claim_objects([*release_object, *manifests])
        if taken:
            self.refuse([f"args.queued_pools: {t}" for t in taken])
        if release_plan is not None:
            # CRDs and the admission webhook are ready before any queue object.
            keep = self._of_plan
            release = helm_release(release_plan, self.child_options(), name, keep_name=keep)
            self.ready.append(release)
            # Helm waited for the pods; their webhook answers 10-30 s later (the gate).
            after = self.child_options(depends_on=gated(self, gate, depends_on=[release]))
            for manifest in manifests:
                self.ready.append(custom_resource(manifest, after, component=name, keep_name=keep))
        self.local_queues = pulumi.Output.from_input(
            [m["metadata"]["name"] for m in manifests if m["kind"] == "LocalQueue"]
        )
        self.register()
