"""Kueue for queued (DWS) TPU capacity: the Helm release, then its objects (CRDs come first)."""

from __future__ import annotations

import pulumi
from pulumi_kubernetes import Provider
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.helm.v3 import Release

from infra.config import StackConfig
from infra.plan import kueue


class Kueue(pulumi.ComponentResource):
    """Kueue at the pinned chart version, a ResourceFlavor / ClusterQueue / LocalQueue per queued
    pool and the DWS admission check. Creates nothing when no pool is queued."""

    def __init__(
        self,
        name: str,
        config: StackConfig,
        provider: Provider,
        depends_on: list[pulumi.Resource],
        namespace_ready: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:kueue:Kueue", name, None, opts)
        self.ready: list[pulumi.Resource] = []
        plan = kueue.helm_release(config)
        if plan is None:
            self.register_outputs({"installed": False})
            return
        release = Release(
            plan.name,
            name=plan.name,
            chart=plan.chart,
            version=plan.version,
            namespace=plan.namespace,
            create_namespace=True,
            atomic=True,
            wait_for_jobs=True,  # CRDs and the admission webhook ready before any queue object
            timeout=600,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on),
        )
        after = [release, *namespace_ready]  # LocalQueues live in the workload namespace
        for manifest in kueue.manifests(config):
            meta = manifest["metadata"]
            self.ready.append(
                CustomResource(
                    f"{manifest['kind'].lower()}-{meta['name']}",
                    api_version=manifest["apiVersion"],
                    kind=manifest["kind"],
                    metadata=meta,
                    spec=manifest["spec"],
                    opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after),
                )
            )
        self.ready.insert(0, release)
        self.register_outputs(
            {
                "installed": True,
                "version": plan.version,
                "local_queues": [kueue.local_queue_name(p) for p in kueue.queued_pools(config)],
            }
        )
