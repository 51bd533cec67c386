"""Everything inside the cluster, through one Kubernetes provider built from the cluster.

Order is declared, not hoped for: the operator (add-on or Helm releases) and its CRDs exist
before any RayJob / RayService; the namespace and service account before the workloads.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_kubernetes import Provider
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.core.v1 import Namespace, Secret, ServiceAccount
from pulumi_kubernetes.helm.v3 import Release
from pulumi_kubernetes.networking.v1 import NetworkPolicy

from infra.names import HF_SECRET_KEY
from infra.plan.operator import HelmReleasePlan
from infra.plan.workspace import WorkspacePlan


def kubernetes_provider(
    name: str, kubeconfig: pulumi.Input[str], depends_on: list[pulumi.Resource]
) -> Provider:
    # Server-side apply: KubeRay's CRDs are too large for client-side apply annotations.
    return Provider(
        name,
        kubeconfig=kubeconfig,
        enable_server_side_apply=True,
        opts=pulumi.ResourceOptions(depends_on=depends_on),
    )


def helm_release(plan: HelmReleasePlan, opts: pulumi.ResourceOptions) -> Release:
    """A planned chart, installed atomically and waited for: its CRDs and webhooks are ready
    before anything that depends on the release is created."""
    return Release(
        plan.name,
        name=plan.name,
        chart=plan.chart,
        version=plan.version,
        repository_opts={"repo": plan.repo} if plan.repo else None,
        namespace=plan.namespace,
        create_namespace=True,
        values=plan.values,
        atomic=True,
        wait_for_jobs=True,
        timeout=600,
        opts=opts,
    )


def custom_resource(
    manifest: dict[str, Any], opts: pulumi.ResourceOptions, resource_name: str | None = None
) -> CustomResource:
    """A planned custom-resource manifest as a Pulumi resource (`spec` and `metadata` as is),
    named `<kind>-<name>` unless told otherwise."""
    return CustomResource(
        resource_name or f"{manifest['kind'].lower()}-{manifest['metadata']['name']}",
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=opts,
    )


class KubeRayOperator(pulumi.ComponentResource):
    """KubeRay by Helm (with cert-manager and the TPU webhook for multi-host), or nothing to
    create when GKE's Ray Operator add-on provides it (the cluster enables the add-on)."""

    def __init__(
        self,
        name: str,
        install: str,
        plans: list[HelmReleasePlan],
        provider: Provider,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:k8s:KubeRayOperator", name, None, opts)
        self.ready: list[pulumi.Resource] = list(depends_on)
        releases: dict[str, Release] = {}
        for plan in plans:
            after = [releases[d] for d in plan.depends_on] or depends_on
            releases[plan.name] = helm_release(
                plan, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after)
            )
        self.ready += list(releases.values())
        self.mode = install
        self.register_outputs({"mode": self.mode, "releases": list(releases)})


class Workspace(pulumi.ComponentResource):
    """The workload namespace, its Workload Identity KSA, the HF token Secret and the
    NetworkPolicy that keeps Ray's ports inside the namespace."""

    def __init__(
        self,
        name: str,
        plan: WorkspacePlan,
        provider: Provider,
        hf_token: pulumi.Output[str] | None,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:k8s:Workspace", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on)
        namespace = plan.namespace["metadata"]["name"]
        ns = Namespace(namespace, metadata=plan.namespace["metadata"], opts=child)
        in_ns = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns])
        ksa = plan.service_account
        self.service_account = ServiceAccount(
            ksa["metadata"]["name"], metadata=ksa["metadata"], opts=in_ns
        )
        policy = plan.network_policy
        NetworkPolicy(
            policy["metadata"]["name"], metadata=policy["metadata"], spec=policy["spec"], opts=in_ns
        )
        self.hf_secret = None
        if hf_token is not None:
            meta = plan.hf_token_secret
            self.hf_secret = Secret(
                meta["metadata"]["name"],
                metadata=meta["metadata"],
                type=meta["type"],
                string_data={HF_SECRET_KEY: pulumi.Output.secret(hf_token)},
                opts=in_ns,
            )
        self.ready: list[pulumi.Resource] = [ns, self.service_account]
        if self.hf_secret is not None:
            self.ready.append(self.hf_secret)
        self.register_outputs({"namespace": namespace})


class RayWorkload(pulumi.ComponentResource):
    """A RayJob or RayService from its manifest (`park:ray:TrainingJob` / `park:ray:LlmService`)."""

    def __init__(
        self,
        type_name: str,
        manifest: dict[str, Any],
        provider: Provider,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        name = manifest["metadata"]["name"]
        super().__init__(f"park:ray:{type_name}", name, None, opts)
        self.resource = custom_resource(
            manifest,
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on),
            resource_name=f"{name}-{manifest['kind'].lower()}",
        )
        self.register_outputs({"kind": manifest["kind"], "name": name})
