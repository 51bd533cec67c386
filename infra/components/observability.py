"""Metrics (PodMonitorings, training log metrics, a Grafana dashboard) and the opt-in IAP access
to the Ray dashboard. Provider submodules load only when a stack uses them."""

from __future__ import annotations

import pulumi
from pulumi_kubernetes import Provider

from infra.components.kubernetes import custom_resource
from infra.plan.observability import IAP_ROLE, MetricsPlan, value_extractor
from infra.plan.observability import DashboardAccess as DashboardAccessPlan


class RayMetrics(pulumi.ComponentResource):
    """Managed Prometheus scrapes of the Ray pods, training loss and tokens/s from the logs, and
    the Grafana dashboard ConfigMap when asked for."""

    def __init__(
        self,
        name: str,
        plan: MetricsPlan,
        provider: Provider,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:observability:RayMetrics", name, None, opts)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on)
        for manifest in plan.pod_monitorings:
            custom_resource(manifest, in_cluster)

        if plan.log_metrics:
            from pulumi_gcp.logging import Metric

            for metric in plan.log_metrics:
                Metric(
                    metric.name,
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
                    opts=pulumi.ResourceOptions(parent=self),
                )

        configmap = plan.grafana_configmap
        if configmap is not None:
            from pulumi_kubernetes.core.v1 import ConfigMap

            ConfigMap(
                configmap["metadata"]["name"],
                metadata=configmap["metadata"],
                data=configmap["data"],
                opts=in_cluster,
            )
        self.register_outputs(
            {
                "pod_monitorings": [m["metadata"]["name"] for m in plan.pod_monitorings],
                "log_metrics": [m.promql for m in plan.log_metrics],
                "grafana": configmap is not None,
            }
        )


class DashboardAccess(pulumi.ComponentResource):
    """The RayService's dashboard on https://<dashboardDomain>, behind IAP: a static IP and a
    Google-managed certificate, the Gateway, its route and the IAP backend policy, and the IAM
    grant that lets `iapMembers` through. Exists only with park:observability.exposeDashboard."""

    url: pulumi.Output[str]
    ip_address: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        project: str,
        access: DashboardAccessPlan,
        provider: Provider,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:observability:DashboardAccess", name, None, opts)
        from pulumi_gcp.compute import GlobalAddress, ManagedSslCertificate
        from pulumi_gcp.iap import WebIamMember

        child = pulumi.ResourceOptions(parent=self)
        address = GlobalAddress(
            access.address_name, name=access.address_name, project=project, opts=child
        )
        certificate = ManagedSslCertificate(
            access.certificate_name,
            name=access.certificate_name,
            project=project,
            managed={"domains": [access.domain]},
            opts=child,
        )
        # Project-wide: GKE names the backend service, so a per-backend grant cannot be declared;
        # the condition keeps it to this stack's host (infra/plan/observability.py).
        for member in access.iap_members:
            WebIamMember(
                f"iap-{member.replace(':', '-').replace('@', '-at-')}",
                project=project,
                role=IAP_ROLE,
                member=member,
                condition=access.iap_condition,
                opts=child,
            )
        in_cluster = pulumi.ResourceOptions(
            parent=self, provider=provider, depends_on=[*depends_on, address, certificate]
        )
        for manifest in access.manifests:
            if manifest["kind"] == "Service":
                from pulumi_kubernetes.core.v1 import Service

                Service(
                    manifest["metadata"]["name"],
                    metadata=manifest["metadata"],
                    spec=manifest["spec"],
                    opts=in_cluster,
                )
            else:
                custom_resource(manifest, in_cluster)
        self.url = pulumi.Output.from_input(f"https://{access.domain}")
        self.ip_address = address.address
        self.register_outputs({"url": self.url, "ip_address": self.ip_address})
