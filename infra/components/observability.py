"""Metrics (PodMonitorings, training log metrics, a Grafana dashboard) and the opt-in IAP access
to the Ray dashboard. Provider submodules load only when a stack uses them."""

from collections.abc import Mapping
from typing import Any, NotRequired

import pulumi

from infra.components._args import KubeconfigArgs
from infra.components._base import (
    ComponentArgsError,
    KubernetesComponent,
    bad_value,
    name_problems,
    site_values,
    stack_of,
    stack_values,
)
from infra.components._handles import ServiceRef
from infra.components._naming import child_name, claim, renamed
from infra.components.gates import GateRun, gated
from infra.components.kubernetes import custom_resource
from infra.names import PART_OF, RFC1035_NAME, SERVICE_NAME
from infra.plan.dashboard_access import IAP_ROLE, dashboard_access
from infra.plan.dashboard_access import DashboardAccess as AccessPlan
from infra.plan.metrics import STACK_PROGRAM, Watched, value_extractor
from infra.plan.observability import MetricsPlan, metrics
from infra.rules import grammar
from infra.rules.platform import check_observability
from infra.rules.values import check_values
from infra.schema.safe import shown


class RayMetricsArgs(KubeconfigArgs):
    """Managed Prometheus scrapes of every Ray pod of a namespace, training loss and tokens/s
    as log-based metrics, and an optional Grafana dashboard."""

    project: str
    """The project of the log-based metrics."""
    cluster_name: str
    """The GKE cluster (the log filter's cluster_name)."""
    stack: NotRequired[str]
    """Metric names derive from it (park_<stack>_train_*); default: the Pulumi stack's name."""
    namespace: NotRequired[str]
    """Kubernetes namespace of the Ray workloads. Default: park."""
    training_jobs: NotRequired[list[str]]
    """The training jobs it watches: the workload label of their pods (a RayTrainingJob's
    name); in Python, the RayTrainingJobs themselves. With `services` or this set, the
    PodMonitorings scrape these workloads' pods only and the dashboard is about them; with
    neither, every Ray pod of the namespace and the stack program's park-train/park-serve."""
    services: NotRequired[list[str]]
    """The serving endpoints it watches: the workload label of their pods (an LlmService's
    name); in Python, the LlmServices themselves."""
    training: NotRequired[bool]
    """A training RayJob runs there: create its log-based metrics (default: true, or whether
    `training_jobs` names any when the workloads are given)."""
    pod_monitoring: NotRequired[bool]
    """PodMonitoring for Ray head and workers. Default: true."""
    tpu_metrics: NotRequired[bool]
    """TPU chip metrics (`ray_tpu_*`, from the TPU device plugin). Default: true."""
    training_metrics: NotRequired[bool]
    """Loss and tokens/s as log-based metrics. Default: true."""
    grafana: NotRequired[bool]
    """A Grafana dashboard ConfigMap (`grafana_dashboard: "1"`). Default: false."""
    scrape_interval: NotRequired[str]
    """Managed Prometheus scrape interval of Ray pods. Default: 30s."""


class DashboardAccessArgs(KubeconfigArgs):
    """The RayService's Ray dashboard on https://<domain>, behind IAP."""

    project: str
    """The project of the address, certificate and IAP grant."""
    domain: str
    """Host name of the IAP-protected dashboard (certificate)."""
    iap_members: list[str]
    """Who IAP lets in, e.g. `group:ml@example.com`."""
    oauth_client_id: str
    """OAuth client id IAP signs users in with."""
    oauth_secret: str
    """Secret (key `key`) holding that client's secret."""
    oauth_client_secret: NotRequired[pulumi.Input[str]]
    """That client's secret itself (a secret): stored as the `oauth_secret` Secret here, in
    order after the namespace. Unset: the Secret is created out of band."""
    stack: NotRequired[str]
    """Names derive from it (park-<stack>-ray-dashboard); default: the Pulumi stack's name."""
    namespace: NotRequired[str]
    """Kubernetes namespace of the Ray workloads. Default: park."""
    service: NotRequired[ServiceRef]
    """The LlmService whose Ray dashboard it exposes: the workload label of its pods (its
    name; default park-serve, the stack program's); in Python, the LlmService itself."""


# DashboardAccess's arguments by the park:observability keys they stand for.
_DASHBOARD_ARGUMENTS = {
    "dashboardDomain": "domain",
    "iapMembers": "iap_members",
    "iapOauthClientId": "oauth_client_id",
    "iapOauthSecret": "oauth_secret",
}


def _argument(key: str) -> str:
    """``park:observability.iapMembers[0]`` → ``iap_members[0]``."""
    field = key.removeprefix("park:observability.")
    name, bracket, rest = field.partition("[")
    return _DASHBOARD_ARGUMENTS.get(name, name) + bracket + rest


def _cluster_name_problem(name: str) -> str | None:
    """A GKE cluster name (the log filter's cluster_name): 1-40 characters, RFC 1035."""
    if len(name) <= 40 and grammar.RFC1035.match(name):
        return None
    return "a GKE cluster name: 1-40 lowercase letters, digits and '-', starting with a letter"


def _observed(args: Any, observability: dict[str, Any], training: bool) -> dict[str, Any]:
    """The stack-config values of the part of a stack the component's arguments describe."""
    values: dict[str, Any] = {
        **site_values(args["project"], "us-east5-b"),
        "park:observability": observability,
        "park:training": {"enabled": training},
    }
    if args.get("namespace"):
        values["park:namespace"] = args["namespace"]
    if args.get("cluster_name"):
        values["park:cluster"] = {"name": args["cluster_name"]}
    return values


def _watched(name: str, args: Mapping[str, Any]) -> Watched:
    """The workloads given (`training_jobs`, `services`: workload labels, components handed
    on), or the stack program's when neither is."""
    if args.get("training_jobs") is None and args.get("services") is None:
        return STACK_PROGRAM
    given = {field: tuple(args.get(field) or ()) for field in ("training_jobs", "services")}
    refused = [
        bad_value(f"{field}[{i}]", label, "not a workload's name (lowercase letters, digits, '-')")
        for field, labels in given.items()
        for i, label in enumerate(labels)
        if not RFC1035_NAME.match(label)
    ]
    if refused:
        raise ComponentArgsError("RayMetrics", name, refused)
    return Watched(training=given["training_jobs"], serving=given["services"], only=True)


def _child(
    kind: Any,
    component: str,
    role: str,
    legacy: str | None,
    opts: pulumi.ResourceOptions,
    /,
    **inputs: Any,
) -> Any:
    """A child resource named `<component>-<role>`; the stack program's old logical name
    `legacy` kept as an alias (renamed; None: none to keep)."""
    resource_name = child_name(component, role)
    return kind(resource_name, **inputs, opts=renamed(opts, resource_name, legacy))


def _object(
    owner: KubernetesComponent,
    kind: Any,
    role: str,
    opts: pulumi.ResourceOptions,
    manifest: dict[str, Any],
    body: str,
) -> Any:
    """A manifest's object as `owner`'s typed child (`kind`): its metadata and its `body` field
    (`data`, `spec`); the old logical name kept is the object's name."""
    meta = manifest["metadata"]
    return _child(
        kind,
        owner._component_name,
        role,
        owner.legacy(meta["name"]),
        opts,
        metadata=meta,
        **{body: manifest[body]},
    )


class RayMetrics(KubernetesComponent):
    """Managed Prometheus scrapes of the Ray pods, training loss and tokens/s from the logs, and
    the Grafana dashboard ConfigMap when asked for."""

    pod_monitorings: pulumi.Output[list[str]]
    """The PodMonitorings created."""
    log_metrics: pulumi.Output[list[str]]
    """The log-based metrics, by their PromQL names."""

    def __init__(self, name: str, args: RayMetricsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, RayMetricsArgs)
        wrong = name_problems(
            args, {"namespace": grammar.namespace_problem, "cluster_name": _cluster_name_problem}
        )
        if wrong:
            self.refuse(wrong)
        observability = stack_values(
            args, "pod_monitoring", "tpu_metrics", "training_metrics", "grafana", "scrape_interval"
        )
        watched = _watched(name, args)
        values = _observed(args, observability, args.get("training", bool(watched.training)))
        fields = [("park:observability.", ""), ("park:namespace", "namespace")]
        plan = metrics(self.plan(values, fields, stack=stack_of(args), rules=False), watched)
        self._build(plan, args.get("namespace", "park"))

    @classmethod
    def of_plan(
        cls,
        name: str,
        plan: MetricsPlan,
        namespace: str,
        opts: pulumi.ResourceOptions | None = None,
        gate: GateRun | None = None,
    ) -> "RayMetrics":
        """The stack program's: its plan's metrics (infra.plan.observability.metrics), the
        PodMonitorings after `gate` (their CRD Established: infra.plan.gates)."""
        self = cls.planned(name, opts)
        self._build(plan, namespace, gate)
        return self

    def _build(self, plan: MetricsPlan, namespace: str, gate: GateRun | None = None) -> None:
        name = self._component_name
        objects = [*plan.pod_monitorings, plan.grafana_configmap]
        taken: list[str | None] = [*self.claim_objects([o for o in objects if o is not None])]
        taken += [
            claim(self.owner, f"log-based metric {m.name}", (plan.project,))
            for m in plan.log_metrics
        ]
        self.refuse_taken("namespace", namespace, taken)
        in_cluster = self.child_options()
        scraped = self.child_options(depends_on=gated(self, gate) if plan.pod_monitorings else [])
        for manifest in plan.pod_monitorings:
            custom_resource(manifest, scraped, component=name, keep_name=self._of_plan)
        if plan.log_metrics:
            from pulumi_gcp.logging import Metric

            for metric in plan.log_metrics:
                _child(
                    Metric,
                    name,
                    metric.name,
                    self.legacy(metric.name),
                    in_cluster,
                    name=metric.name,
                    project=plan.project,
                    description=metric.description,
                    filter=plan.log_filter,
                    value_extractor=value_extractor(metric.field),
                    metric_descriptor={
                        "metric_kind": "DELTA",
                        "value_type": "DISTRIBUTION",
                        "unit": metric.unit,
                        "display_name": metric.description,
                    },
                    bucket_options={
                        "exponential_buckets": {
                            "num_finite_buckets": 64,
                            "growth_factor": metric.growth_factor,
                            "scale": metric.scale,
                        }
                    },
                )
        configmap = plan.grafana_configmap
        if configmap is not None:
            from pulumi_kubernetes.core.v1 import ConfigMap

            _object(self, ConfigMap, "grafana", in_cluster, configmap, "data")
        self.pod_monitorings = pulumi.Output.from_input(
            [m["metadata"]["name"] for m in plan.pod_monitorings]
        )
        self.log_metrics = pulumi.Output.from_input([m.promql for m in plan.log_metrics])
        self.register()


class DashboardAccess(KubernetesComponent):
    """The RayService's dashboard on https://<dashboardDomain>, behind IAP: a static IP and a
    Google-managed certificate, the Gateway, its route and the IAP backend policy, and the IAM
    grant that lets `iapMembers` through. Exists only with park:observability.exposeDashboard."""

    url: pulumi.Output[str]
    """https://<domain>: the dashboard, once the certificate is issued and DNS points here."""
    ip_address: pulumi.Output[str]
    """The static address to point the domain's DNS A record at."""

    def __init__(
        self, name: str, args: DashboardAccessArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, DashboardAccessArgs)
        wrong = name_problems(
            args,
            {
                "namespace": grammar.namespace_problem,
                "service": grammar.dns1035_label_problem,
                "oauth_secret": grammar.dns1123_subdomain_problem,
            },
        )
        if wrong:
            self.refuse(wrong)
        observability = {
            "exposeDashboard": True,
            "dashboardDomain": args["domain"],
            "iapMembers": list(args["iap_members"]),
            "iapOauthClientId": args["oauth_client_id"],
            "iapOauthSecret": args["oauth_secret"],
        }
        stack = stack_of(args)
        values = _observed(args, observability, False)
        fields = [("park:observability.iapOauth", "oauth_"), ("park:observability.", "")]
        stack_plan = self.plan(values, fields, stack=stack, rules=False)
        refused = [
            p
            for p in [*check_observability(stack_plan.spec), *check_values(stack_plan.spec)]
            if p.key.startswith("park:observability.")  # its own arguments
            and p.key != "park:observability.exposeDashboard"  # the RayService is the caller's
        ]
        if refused:
            self.refuse(
                [f"args.{_argument(p.key)} = {shown(p.value)}: {p.message}" for p in refused]
            )
        access = dashboard_access(stack_plan, args.get("service") or SERVICE_NAME)
        assert access is not None
        self._build(access, args.get("oauth_client_secret"))

    @classmethod
    def of_plan(
        cls,
        name: str,
        access: AccessPlan,
        opts: pulumi.ResourceOptions | None = None,
        gate: GateRun | None = None,
        oauth_client_secret: pulumi.Input[str] | None = None,
    ) -> "DashboardAccess":
        """The stack program's: its plan's dashboard access (infra.plan.dashboard_access),
        with the OAuth client's secret when the stack holds it; the Gateway kinds after `gate`
        (their CRDs Established: infra.plan.gates)."""
        self = cls.planned(name, opts)
        self._build(access, oauth_client_secret, gate)
        return self

    def _build(
        self,
        access: AccessPlan,
        oauth_client_secret: pulumi.Input[str] | None,
        gate: GateRun | None = None,
    ) -> None:
        name = self._component_name
        project, namespace, oauth_secret = access.project, access.namespace, access.oauth_secret
        taken: list[str | None] = [*self.claim_objects(list(access.manifests))]
        taken += [
            claim(self.owner, f"global address {access.address_name}", (project,)),
            claim(self.owner, f"certificate {access.certificate_name}", (project,)),
        ]
        self.refuse_taken("stack", access.stack, taken)
        from pulumi_gcp.compute import GlobalAddress, ManagedSslCertificate
        from pulumi_gcp.iap import WebIamMember

        child = self.child_options()

        def named(kind: Any, role: str, cloud_name: str, **inputs: Any) -> Any:
            """A child of the project named by the plan, that name its old logical name."""
            legacy = self.legacy(cloud_name)
            return _child(
                kind, name, role, legacy, child, name=cloud_name, project=project, **inputs
            )

        address = named(GlobalAddress, "address", access.address_name)
        managed = {"domains": [access.domain]}
        certificate = named(
            ManagedSslCertificate, "certificate", access.certificate_name, managed=managed
        )
        # Project-wide: GKE names the backend service, so a per-backend grant cannot be declared;
        # the condition keeps it to this stack's host (infra/plan/dashboard_access.py).
        for member in access.iap_members:
            legacy = f"iap-{member.replace(':', '-').replace('@', '-at-')}"
            _child(
                WebIamMember,
                name,
                legacy,
                self.legacy(legacy),
                child,
                project=project,
                role=IAP_ROLE,
                member=member,
                condition=access.iap_condition,
            )
        in_cluster = self.child_options(depends_on=[address, certificate])
        custom = self.child_options(depends_on=gated(self, gate, depends_on=[address, certificate]))
        if oauth_client_secret is not None:
            from pulumi_kubernetes.core.v1 import Secret

            _child(
                Secret,
                name,
                "oauth-secret",
                self.legacy(oauth_secret),
                self.child_options(),
                metadata={
                    "name": oauth_secret,
                    "namespace": namespace,
                    "labels": PART_OF,
                },
                type="Opaque",
                string_data={"key": pulumi.Output.secret(oauth_client_secret)},
            )
        for manifest in access.manifests:
            if manifest["kind"] == "Service":
                from pulumi_kubernetes.core.v1 import Service

                _object(self, Service, "service", in_cluster, manifest, "spec")
            else:
                custom_resource(manifest, custom, component=name, keep_name=self._of_plan)
        self.url = pulumi.Output.from_input(f"https://{access.domain}")
        self.ip_address = address.address
        self.register()
