"""Kueue for queued (DWS) TPU capacity: the Helm release, then its objects (CRDs come first)."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_kubernetes import Provider

from infra.components.kubernetes import custom_resource, helm_release
from infra.plan.operator import HelmReleasePlan


class Kueue(pulumi.ComponentResource):
    """Kueue at the pinned chart version, a ResourceFlavor / ClusterQueue / LocalQueue per queued
    pool and the DWS admission check. Creates nothing when no pool is queued."""

    def __init__(
        self,
        name: str,
        plan: HelmReleasePlan | None,
        manifests: list[dict[str, Any]],
        provider: Provider,
        depends_on: list[pulumi.Resource],
        namespace_ready: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:kueue:Kueue", name, None, opts)
        self.ready: list[pulumi.Resource] = []
        if plan is None:
            self.register_outputs({"installed": False})
            return
        # CRDs and the admission webhook are ready before any queue object.
        release = helm_release(
            plan, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on)
        )
        after = [release, *namespace_ready]  # LocalQueues live in the workload namespace
        for manifest in manifests:
            self.ready.append(
                custom_resource(
                    manifest,
                    pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after),
                )
            )
        self.ready.insert(0, release)
        self.register_outputs(
            {
                "installed": True,
                "version": plan.version,
                "local_queues": [
                    m["metadata"]["name"] for m in manifests if m["kind"] == "LocalQueue"
                ],
            }
        )
