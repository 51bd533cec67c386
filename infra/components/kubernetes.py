"""Inside the cluster: KubeRay (the add-on, or Helm charts) and the workload namespace.

Give these components a Kubernetes provider in their options
(`ResourceOptions(providers={"kubernetes": provider})`); their children inherit it.
Server-side apply: KubeRay's CRDs are too large for client-side apply's annotation.
"""

from typing import Any, NotRequired

import pulumi
from pulumi_kubernetes import Provider
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.core.v1 import Namespace, Secret, ServiceAccount
from pulumi_kubernetes.helm.v3 import Release
from pulumi_kubernetes.networking.v1 import NetworkPolicy
from pulumi_kubernetes.policy.v1 import PodDisruptionBudget

from infra.components._args import KubeconfigArgs
from infra.components._base import (
    KubernetesComponent,
    bad_value,
    checked_model,
    child_options,
    name_problems,
    namespace_names,
    stack_of,
)
from infra.components._naming import child_name, claim, cluster_key, renamed
from infra.components._types import KubeRayInstallArg
from infra.components.gates import GateRun, gated
from infra.names import HF_SECRET_KEY
from infra.plan.network_policy import Exposure
from infra.plan.operator import HelmReleasePlan, helm_releases
from infra.plan.ray.pods import RAY_KINDS, head_disruption_budget
from infra.plan.workspace import WorkspacePlan, workspace
from infra.rules import grammar
from infra.schema.models import KubeRayConfig, NetworkConfig


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


def helm_release(
    plan: HelmReleasePlan,
    opts: pulumi.ResourceOptions,
    resource_name: str | None = None,
    *,
    keep_name: bool = False,
) -> Release:
    """A planned chart, installed atomically and waited for: its CRDs and webhooks are ready
    before anything that depends on the release is created. Logical name `resource_name`
    (the component's child name), else the release's; with `keep_name` (the stack program's
    components), the old name is kept as an alias."""
    resource_name = resource_name or plan.name
    return Release(
        resource_name,
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
        opts=renamed(opts, resource_name, plan.name if keep_name else None),
    )


def object_name(manifest: dict[str, Any]) -> str:
    """``<kind>-<name>``: what a component's child for this object is called after."""
    return f"{manifest['kind'].lower()}-{manifest['metadata']['name']}"


def custom_resource(
    manifest: dict[str, Any],
    opts: pulumi.ResourceOptions,
    resource_name: str | None = None,
    *,
    component: str | None = None,
    keep_name: bool = False,
) -> CustomResource:
    """A planned custom-resource manifest as a Pulumi resource (`spec` and `metadata` as is),
    named `<component>-<kind>-<name>`, or `resource_name`; with `keep_name` (the stack
    program's components), the old `<kind>-<name>` is kept as an alias. A Ray object (RayJob,
    RayService, RayCluster) comes with its head's PodDisruptionBudget
    (infra.plan.ray.pods.head_disruption_budget), `<resource_name>-head`, beside it under the
    same parent: whichever component creates a Ray object keeps its head from eviction."""
    legacy = object_name(manifest)
    if resource_name is None:
        resource_name = child_name(component, legacy) if component else legacy
    if manifest["kind"] in RAY_KINDS:
        budget = head_disruption_budget(manifest)
        PodDisruptionBudget(
            f"{resource_name}-head",
            metadata=budget["metadata"],
            spec=budget["spec"],
            opts=opts,
        )
    return CustomResource(
        resource_name,
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=renamed(opts, resource_name, legacy if keep_name else None),
    )


class KubeRayOperatorArgs(KubeconfigArgs):
    """How KubeRay gets onto the cluster: GKE's Ray Operator add-on (enabled on the Cluster:
    nothing to create here), or the kuberay-operator Helm chart, plus cert-manager and the
    KubeRay TPU webhook when the cluster has multi-host TPU slices."""

    install: KubeRayInstallArg
    """`addon` (GKE Ray Operator add-on, with the TPU webhook) or `helm`."""
    version: NotRequired[str]
    """kuberay-operator chart version (helm). Default: 1.7.0."""
    multi_host_tpu: NotRequired[bool]
    """The cluster has multi-host TPU slices: helm then installs the TPU webhook too."""
    tpu_webhook_chart: NotRequired[str]
    """helm, multi-host: path of the kuberay-tpu-webhook chart."""


class KubeRayOperator(KubernetesComponent):
    """KubeRay by Helm (with cert-manager and the TPU webhook for multi-host), or nothing to
    create when GKE's Ray Operator add-on provides it."""

    releases: pulumi.Output[list[str]]
    """The Helm releases installed (none for the add-on)."""

    def __init__(
        self, name: str, args: KubeRayOperatorArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, KubeRayOperatorArgs)
        spec = checked_model(
            "KubeRayOperator",
            name,
            KubeRayConfig,
            {k: v for k, v in args.items() if k in ("install", "version", "tpu_webhook_chart")},
        )
        self._build(helm_releases(spec, bool(args.get("multi_host_tpu"))), spec.install)

    @classmethod
    def of_plan(
        cls,
        name: str,
        releases: list[HelmReleasePlan],
        install: str,
        opts: pulumi.ResourceOptions | None = None,
        crds_gate: GateRun | None = None,
        cert_manager_gate: GateRun | None = None,
    ) -> "KubeRayOperator":
        """The stack program's: its plan's KubeRay releases (infra.plan.operator), and its
        readiness gates (infra.plan.gates): the ray.io CRDs Established (`crds_ready`), and
        cert-manager's webhook answering before the TPU webhook's release."""
        self = cls.planned(name, opts)
        self._build(releases, install, crds_gate, cert_manager_gate)
        return self

    def _build(
        self,
        planned: list[HelmReleasePlan],
        install: str,
        crds_gate: GateRun | None = None,
        cert_manager_gate: GateRun | None = None,
    ) -> None:
        name = self._component_name
        self.ready: list[pulumi.Resource] = []
        releases: dict[str, Release] = {}
        cluster = cluster_key(self, self._component_opts)
        taken = [
            claim(self.owner, f"Helm release {r.namespace}/{r.name}", (cluster,)) for r in planned
        ]
        self.refuse_taken("install", install, taken)
        for release in planned:
            after: list[pulumi.Resource] = [releases[d] for d in release.depends_on]
            if "cert-manager" in release.depends_on:  # its Certificates and Issuers
                after = gated(self, cert_manager_gate, "cert-manager-ready", after)
            releases[release.name] = helm_release(
                release,
                self.child_options(depends_on=after),
                child_name(name, release.name),
                keep_name=self._of_plan,
            )
        self.ready += list(releases.values())
        # What a RayJob or RayService waits for: the releases, and the CRDs Established.
        self.crds_ready: list[pulumi.Resource] = gated(self, crds_gate, depends_on=self.ready)
        self.mode = install
        self.releases = pulumi.Output.from_input(list(releases))
        self.register(mode=self.mode)


class WorkspaceArgs(KubeconfigArgs):
    """The Ray pods' namespace, their Kubernetes service account (bound through Workload
    Identity), the HF token Secret, and the NetworkPolicy that lets in what Ray on GKE needs."""

    project: str
    """The GCP project (the Workload Identity pool's)."""
    stack: NotRequired[str]
    """Names derive from it (the KSA park-<stack>-workload); default: the Pulumi stack's name."""
    namespace: NotRequired[str]
    """Kubernetes namespace of the Ray workloads. Default: park."""
    kuberay_install: NotRequired[KubeRayInstallArg]
    """`addon` (GKE Ray Operator add-on, with the TPU webhook) or `helm`. Default: addon."""
    master_cidr: NotRequired[str]
    """/28 of the private control plane. Default: 172.16.0.0/28."""
    expose_serve: NotRequired[bool]
    """Let the internet reach Serve's port (a public LoadBalancer)."""
    expose_dashboard: NotRequired[bool]
    """Let Google's front ends (the IAP Gateway) reach the dashboard."""
    hf_token: NotRequired[pulumi.Input[str]]
    """A Hugging Face token (a secret): stored as a Secret the pods read as a file."""


class Workspace(KubernetesComponent):
    """The workload namespace and what every Ray pod in it relies on."""

    namespace: pulumi.Output[str]
    """The namespace."""
    service_account: pulumi.Output[str]
    """The Ray pods' Kubernetes service account."""

    def __init__(self, name: str, args: WorkspaceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, WorkspaceArgs)
        install = self.kuberay_install(args)
        wrong = name_problems(args, {"namespace": grammar.namespace_problem})
        if wrong:
            self.refuse(wrong)
        names = namespace_names(args)
        exposed = Exposure(
            namespace=names.namespace,
            kuberay_install=install,
            master_cidr=args.get("master_cidr") or NetworkConfig().master_cidr,
            public_serve=bool(args.get("expose_serve")),
            public_dashboard=bool(args.get("expose_dashboard")),
        )
        plan = workspace(names, exposed)
        ksa = plan.service_account["metadata"]["name"]
        if grammar.dns1123_subdomain_problem(ksa) or len(ksa) > 63:
            self.refuse(
                [
                    bad_value(
                        "stack",
                        stack_of(args),
                        f"names the pods' service account {ksa!r} (park-<stack>-workload), "
                        "which must be a DNS-1123 name of at most 63 characters",
                    )
                ]
            )
        self._build(plan, args.get("hf_token"))

    @classmethod
    def of_plan(
        cls,
        name: str,
        plan: WorkspacePlan,
        hf_token: pulumi.Input[str] | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "Workspace":
        """The stack program's: its plan's namespace, service account and NetworkPolicy
        (infra.plan.workspace), with the stack's HF token when it has one."""
        self = cls.planned(name, opts)
        self._build(plan, hf_token)
        return self

    def _build(self, plan: WorkspacePlan, hf_token: pulumi.Input[str] | None) -> None:
        name = self._component_name
        namespace = plan.namespace["metadata"]["name"]
        # The namespace is this workspace's: a second one in it would share its objects.
        self.refuse_taken("namespace", namespace, self.claim_objects([plan.namespace]))

        def named(role: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> Any:
            """Logical name <component>-<role>; the object's own name before (an alias)."""
            resource_name = child_name(name, role)
            legacy = self.legacy(manifest["metadata"]["name"])
            return resource_name, renamed(opts, resource_name, legacy)

        child = self.child_options()
        ns = Namespace(
            *named("namespace", plan.namespace, child), metadata=plan.namespace["metadata"]
        )
        in_ns = child_options(self, None, depends_on=[ns])
        ksa = plan.service_account
        self.service_account_resource = ServiceAccount(
            *named("service-account", ksa, in_ns), metadata=ksa["metadata"]
        )
        policy = plan.network_policy
        NetworkPolicy(
            *named("network-policy", policy, in_ns),
            metadata=policy["metadata"],
            spec=policy["spec"],
        )
        self.hf_secret = None
        if hf_token is not None:
            meta = plan.hf_token_secret
            secret_name, secret_opts = named("hf-token", meta, in_ns)
            self.hf_secret = Secret(
                secret_name,
                metadata=meta["metadata"],
                type=meta["type"],
                string_data={HF_SECRET_KEY: pulumi.Output.secret(hf_token)},
                opts=secret_opts,
            )
        self.ready: list[pulumi.Resource] = [ns, self.service_account_resource]
        if self.hf_secret is not None:
            self.ready.append(self.hf_secret)
        self._namespace = namespace
        self.namespace = pulumi.Output.from_input(namespace)
        self.service_account = pulumi.Output.from_input(ksa["metadata"]["name"])
        self.register()

    def as_argument(self, field: str) -> str | None:
        """Given as a workload's `namespace`: the namespace's name."""
        return self._namespace if field == "namespace" else None
