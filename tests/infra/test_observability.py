"""Observability: Managed Prometheus scrapes of the Ray pods, the Ray add-on's logging and
monitoring flags, training metrics from the logs, the Grafana dashboard, and the Ray dashboard
(private by default, IAP only on opt-in)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from infra import names
from infra.plan import dashboard_access as access_plan
from infra.plan import grafana
from infra.plan import metrics as metric_plan
from infra.plan import ray as ray_plan
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from infra.tools.schemas import validate_manifests
from tests.conftest import SHIPPED_STACKS, STACKS_DIR, render_stack
from workloads import protocol

EXPOSED = "queued"  # the shipped stack that opts in to the IAP dashboard and Grafana


def _values(stack: str) -> dict:
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    values = copy.deepcopy(values)
    values.pop("park:hfToken", None)
    return values


def _config(stack: str, **observability):
    values = _values(stack)
    values["park:observability"] = {**values.get("park:observability", {}), **observability}
    return from_values(values, stack)


def _rayjob(plan):
    return ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))


def _rayservice(plan):
    return ray_plan.rayservice(plan.serving, ray_plan.ray_pods(plan), hf_token=False)


def _problems(stack: str, **observability) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        _config(stack, **observability)
    return {p.key: p.message for p in err.value.problems}


# ---------------------------------------------------------------------------------------------
# Managed Prometheus


def _ray_pod_templates(manifest: dict) -> list[tuple[str, dict]]:
    spec = manifest["spec"]
    cluster = spec.get("rayClusterSpec") or spec["rayClusterConfig"]
    templates = [("head", cluster["headGroupSpec"]["template"])]
    templates += [("worker", g["template"]) for g in cluster["workerGroupSpecs"]]
    return templates


def test_pod_monitorings_scrape_the_port_ray_exports_on():
    """The PodMonitoring's port name must be a container port of every Ray pod it selects, on the
    port Ray's metrics agent listens on (metrics-export-port)."""
    config = _config("dev")
    monitorings = {m["metadata"]["name"]: m for m in metric_plan.pod_monitorings(config)}
    assert set(monitorings) == {"ray-head", "ray-worker"}
    workloads = [_rayjob(config), _rayservice(config)]
    for manifest in workloads:
        for node_type, template in _ray_pod_templates(manifest):
            monitoring = monitorings[f"ray-{node_type}"]["spec"]
            assert monitoring["selector"]["matchLabels"]["ray.io/node-type"] == node_type
            (endpoint,) = monitoring["endpoints"]
            ports = {
                p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]
            }
            assert ports[endpoint["port"]] == names.METRICS_PORT
            group = manifest["spec"].get("rayClusterSpec") or manifest["spec"]["rayClusterConfig"]
            params = (
                group["headGroupSpec"] if node_type == "head" else group["workerGroupSpecs"][0]
            )["rayStartParams"]
            assert params["metrics-export-port"] == str(names.METRICS_PORT)
            # the workload label the PodMonitoring copies onto every series
            assert (
                template["metadata"]["labels"][names.WORKLOAD_LABEL]
                == (manifest["metadata"]["name"])
            )
            assert {"from": names.WORKLOAD_LABEL, "to": "workload"} in monitoring["targetLabels"][
                "fromPod"
            ]


def test_tpu_metrics_come_from_the_device_plugin_or_are_dropped():
    on = _config("dev")
    worker = _rayjob(on)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    env = {e["name"]: e for e in worker["template"]["spec"]["containers"][0]["env"]}
    assert env["TPU_DEVICE_PLUGIN_ADDR"]["value"] == "$(TPU_DEVICE_PLUGIN_HOST_IP):2112"
    assert env["TPU_DEVICE_PLUGIN_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    names = [e["name"] for e in worker["template"]["spec"]["containers"][0]["env"]]
    assert names.index("TPU_DEVICE_PLUGIN_HOST_IP") < names.index("TPU_DEVICE_PLUGIN_ADDR")
    monitors = metric_plan.pod_monitorings(on)
    assert all("metricRelabeling" not in m["spec"]["endpoints"][0] for m in monitors)

    off = _config("dev", tpuMetrics=False)
    worker = _rayjob(off)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert "TPU_DEVICE_PLUGIN_ADDR" not in {
        e["name"] for e in worker["template"]["spec"]["containers"][0]["env"]
    }
    for monitoring in metric_plan.pod_monitorings(off):
        (rule,) = monitoring["spec"]["endpoints"][0]["metricRelabeling"]
        assert rule["action"] == "drop"
        assert re.fullmatch(rule["regex"], "ray_tpu_duty_cycle")
        assert not re.fullmatch(rule["regex"], "ray_serve_num_http_requests_total")
    assert validate_manifests(metric_plan.pod_monitorings(off)) == []


def test_pod_monitoring_can_be_turned_off():
    assert metric_plan.pod_monitorings(_config("dev", podMonitoring=False)) == []


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_ray_addon_logging_and_monitoring_reach_the_cluster(stack):
    rendered = render_stack(stack)
    kuberay = rendered.config.kuberay
    cluster = rendered.one("gcp:container/cluster:Cluster", "gke").inputs
    (ray_operator,) = cluster["addonsConfig"]["rayOperatorConfigs"]
    assert ray_operator["enabled"] is (kuberay.install == "addon")
    if kuberay.install == "addon":
        assert ray_operator["rayClusterLoggingConfig"] == {"enabled": kuberay.logging}
        assert ray_operator["rayClusterMonitoringConfig"] == {"enabled": kuberay.monitoring}
    assert cluster["monitoringConfig"]["managedPrometheus"] == {"enabled": True}


def test_shipped_stacks_differ_in_addon_flags():
    """So the test above checks both values, not one twice."""
    flags = {(render_stack(s).config.kuberay.logging) for s in SHIPPED_STACKS}
    assert flags == {True, False}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_rendered_pod_monitorings(stack):
    rendered = render_stack(stack)
    kinds = [(m["kind"], m["metadata"]["name"]) for m in rendered.manifests()]
    assert ("PodMonitoring", "ray-head") in kinds
    assert ("PodMonitoring", "ray-worker") in kinds
    assert (
        validate_manifests([m for m in rendered.manifests() if m["kind"] == "PodMonitoring"]) == []
    )


# ---------------------------------------------------------------------------------------------
# Training metrics from the logs


def test_log_metrics_extract_loss_and_tokens_per_second():
    config = _config("dev")
    metrics = {m.field: m for m in metric_plan.training_log_metrics(config)}
    assert set(metrics) == {"loss", "tokens_per_s"}
    # A line as the training loop prints it (json.dumps with sorted keys).
    line = protocol.METRICS_PREFIX + json.dumps(
        {"loss": 2.5e-1, "mfu": 0.41, "step": 20, "tokens_per_s": 123456.7}, sort_keys=True
    )
    for field, expected in (("loss", 0.25), ("tokens_per_s", 123456.7)):
        extractor = metric_plan.value_extractor(field)
        pattern = json.loads(re.search(r", (\".*\")\)$", extractor).group(1))
        assert float(re.search(pattern, line).group(1)) == expected
    log_filter = metric_plan.training_log_filter(config)
    assert f'resource.labels.cluster_name="{config.spec.cluster.name}"' in log_filter
    assert f'textPayload:"{protocol.METRICS}"' in log_filter


def test_log_metric_prefix_matches_the_training_loop():
    metrics = pytest.importorskip("workloads.train.run.metrics")
    assert metrics.METRICS_PREFIX == protocol.METRICS_PREFIX


def test_no_log_metrics_without_training():
    values = _values("dev")
    values["park:training"]["enabled"] = False
    values["park:serving"]["enabled"] = False  # dev serves its training run's export
    assert metric_plan.training_log_metrics(from_values(values, "dev")) == []


def test_rendered_log_metrics():
    rendered = render_stack("dev")
    metrics = {r.inputs["name"]: r.inputs for r in rendered.of_type("gcp:logging/metric:Metric")}
    assert set(metrics) == {"park_dev_train_loss", "park_dev_train_tokens_per_s"}
    for inputs in metrics.values():
        assert inputs["metricDescriptor"]["valueType"] == "DISTRIBUTION"
        assert inputs["valueExtractor"].startswith("REGEXP_EXTRACT(textPayload")


# ---------------------------------------------------------------------------------------------
# Grafana


def test_grafana_dashboard_answers_the_readme_questions():
    config = _config(EXPOSED)
    configmap = grafana.grafana_configmap(config)
    assert configmap is not None
    assert configmap["metadata"]["labels"][grafana.GRAFANA_LABEL] == "1"
    dashboard = json.loads(configmap["data"]["park-gke.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in metric_plan.training_log_metrics(config):
        assert metric.promql + "_sum" in exprs
    for series in (
        "ray_tpu_tensorcore_utilization",
        "ray_serve_num_http_requests_total",
        "ray_serve_http_request_latency_ms_bucket",
    ):
        assert series in exprs
    assert f'workload="{names.SERVICE_NAME}"' in exprs
    positions = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dashboard["panels"]]
    assert len(positions) == len(set(positions)), "panels overlap"
    assert grafana.grafana_configmap(_config("dev")) is None


# ---------------------------------------------------------------------------------------------
# The dashboard: private by default, IAP on opt-in


@pytest.mark.parametrize("stack", [s for s in SHIPPED_STACKS if s != EXPOSED])
def test_dashboard_and_serving_stay_private_by_default(stack):
    rendered = render_stack(stack)
    assert not rendered.config.observability.expose_dashboard
    kinds = {m["kind"] for m in rendered.manifests()}
    assert not kinds & {"Gateway", "HTTPRoute", "GCPBackendPolicy", "Ingress"}
    for manifest in rendered.manifests():
        if manifest["kind"] == "Service":
            assert manifest["spec"].get("type", "ClusterIP") == "ClusterIP"
        if manifest["kind"] == "RayService" and not rendered.config.serving.expose_publicly:
            assert manifest["spec"]["serveService"]["spec"]["type"] == "ClusterIP"
        if manifest["kind"] in ("RayJob", "RayService"):
            spec = manifest["spec"]
            cluster = spec.get("rayClusterSpec") or spec["rayClusterConfig"]
            assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert not rendered.of_type("gcp:iap/webIamMember:WebIamMember")
    cluster = rendered.one("gcp:container/cluster:Cluster", "gke").inputs
    assert "gatewayApiConfig" not in cluster


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"iapMembers": []}, "park:observability.iapMembers"),
        ({"dashboardDomain": None}, "park:observability.dashboardDomain"),
        ({"iapOauthClientId": None}, "park:observability.iapOauthClientId"),
        ({"iapOauthSecret": None}, "park:observability.iapOauthSecret"),
        ({"iapMembers": ["ml-team@example.com"]}, "park:observability.iapMembers[0]"),
    ],
)
def test_expose_dashboard_needs_all_iap_settings(setting, key):
    problems = _problems(EXPOSED, **setting)
    assert key in problems, problems


def test_expose_dashboard_needs_a_rayservice():
    values = _values(EXPOSED)
    values["park:serving"]["enabled"] = False
    with pytest.raises(ConfigError) as err:
        from_values(values, EXPOSED)
    assert "park:observability.exposeDashboard" in {p.key for p in err.value.problems}


def test_iap_dashboard_objects_fit_together():
    config = _config(EXPOSED)
    access = access_plan.dashboard_access(config)
    assert access is not None
    objects = {m["kind"]: m for m in access.manifests}
    service, gateway, route, policy = (
        objects[k] for k in ("Service", "Gateway", "HTTPRoute", "GCPBackendPolicy")
    )
    # The Service selects the RayService head by labels that head really carries.
    head = _rayservice(config)["spec"]["rayClusterConfig"]["headGroupSpec"]
    head_labels = {**head["template"]["metadata"]["labels"], "ray.io/node-type": "head"}
    assert service["spec"]["selector"].items() <= head_labels.items()
    dashboard_port = next(
        p for p in head["template"]["spec"]["containers"][0]["ports"] if p["name"] == "dashboard"
    )
    assert service["spec"]["ports"][0]["targetPort"] == dashboard_port["name"]
    assert dashboard_port["containerPort"] == names.DASHBOARD_PORT
    # Route → Service, policy → Service, route → Gateway listener, TLS with the managed cert.
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["name"], backend["port"]) == (
        service["metadata"]["name"],
        names.DASHBOARD_PORT,
    )
    assert policy["spec"]["targetRef"] == {
        "group": "",
        "kind": "Service",
        "name": service["metadata"]["name"],
    }
    iap = policy["spec"]["default"]["iap"]
    assert iap["enabled"] is True
    assert iap["oauth2ClientSecret"]["name"] == config.spec.observability.iap_oauth_secret
    (parent,) = route["spec"]["parentRefs"]
    (listener,) = gateway["spec"]["listeners"]
    assert (parent["name"], parent["sectionName"]) == (
        gateway["metadata"]["name"],
        listener["name"],
    )
    assert listener["protocol"] == "HTTPS" and listener["port"] == 443
    assert listener["tls"]["options"][access_plan.PRE_SHARED_CERT_OPTION] == access.certificate_name
    assert gateway["spec"]["addresses"] == [{"type": "NamedAddress", "value": access.address_name}]
    assert route["spec"]["hostnames"] == [config.spec.observability.dashboard_domain]
    for manifest in (service, gateway, route):
        assert manifest["metadata"]["annotations"][names.EXPOSE_DASHBOARD_ANNOTATION] == "true"
    assert validate_manifests(list(access.manifests)) == []


def test_rendered_iap_dashboard():
    rendered = render_stack(EXPOSED)
    access = access_plan.dashboard_access(rendered.plan)
    assert access is not None
    (address,) = rendered.of_type("gcp:compute/globalAddress:GlobalAddress")
    assert address.parent == "dashboard" and address.inputs["name"] == access.address_name
    (certificate,) = rendered.of_type("gcp:compute/managedSslCertificate:ManagedSslCertificate")
    assert certificate.inputs["name"] == access.certificate_name
    assert certificate.inputs["managed"] == {"domains": [access.domain]}
    members = {r.inputs["member"] for r in rendered.of_type("gcp:iap/webIamMember:WebIamMember")}
    assert members == set(rendered.config.observability.iap_members)
    roles = {r.inputs["role"] for r in rendered.of_type("gcp:iap/webIamMember:WebIamMember")}
    assert roles == {access_plan.IAP_ROLE}
    cluster = rendered.one("gcp:container/cluster:Cluster", "gke").inputs
    assert cluster["gatewayApiConfig"] == {"channel": "CHANNEL_STANDARD"}
    assert rendered.outputs["dashboard_url"] == f"https://{access.domain}"
    policy = next(m for m in rendered.manifests() if m["kind"] == "NetworkPolicy")
    dashboard_rules = [
        rule
        for rule in policy["spec"]["ingress"]
        if {"protocol": "TCP", "port": names.DASHBOARD_PORT} in rule.get("ports", [])
    ]
    assert dashboard_rules, "the Ray pods' NetworkPolicy must let the load balancer reach 8265"
