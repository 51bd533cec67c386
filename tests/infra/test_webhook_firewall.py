"""Private nodes: the control plane reaches every webhook the stack installs (issue 27, item 6).

GKE's own rule admits 443 and 10250 from the control-plane range; every other port a webhook or
aggregated API of an installed chart listens on needs a rule of ours. The ports are read from
the installed charts' own values (tests/data/charts, vendored unchanged), not from our data file
alone; the rule is checked against the Compute API's discovery document.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from infra import webhooks
from infra.plan.cluster import webhook_firewall
from infra.schema.read import read_stack_file
from infra.tools import gke_api
from infra.tools.render import run_program
from tests.conftest import ROOT, SHIPPED_STACKS, STACKS_DIR, render_stack

CHARTS = ROOT / "tests" / "data" / "charts"
FIREWALL = gke_api.FIREWALL
CLUSTER = "gcp:container/cluster:Cluster"


def _values(chart: str) -> dict:
    return yaml.safe_load((CHARTS / chart / "values.yaml").read_text())


def _ports(component: str) -> set[int]:
    return {p.port for p in webhooks.ports_of(component)}


# ---- the data against the charts' own values -------------------------------------------------


def test_kueue_ports_are_the_charts_webhook_and_visibility_ports():
    values = _values("kueue-0.19.2")
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    (service_port,) = values["webhookService"]["ports"]
    assert service_port["targetPort"] == config["webhook"]["port"]
    template = (CHARTS / "kueue-0.19.2/templates/visibility/service.yaml").read_text()
    (visibility,) = re.findall(r"^\s+targetPort: (\d+)$", template, re.MULTILINE)
    assert _ports("kueue") == {config["webhook"]["port"], int(visibility)}


def test_cert_manager_and_tpu_webhook_listen_where_gke_already_admits():
    cert_manager = _values("cert-manager-v1.18.2")["webhook"]["securePort"]
    tpu_webhook = _values("kuberay-tpu-webhook-0.3.1")["tpuWebhook"]["deployment"]["bindPort"]
    assert _ports("cert-manager") == {cert_manager}
    assert _ports("kuberay-tpu-webhook") == {tpu_webhook}
    assert {cert_manager, tpu_webhook} <= set(webhooks.gke_admitted())


def test_the_kuberay_operator_chart_installs_no_webhook():
    values = _values("kuberay-operator-1.7.0")
    assert not any("webhook" in key.lower() for key in values)
    assert _ports("kuberay-operator") == set()


def test_a_component_the_data_does_not_list_is_an_error():
    with pytest.raises(KeyError, match="lists no component 'volcano'"):
        webhooks.ports_of("volcano")


# ---- the rule on the shipped stacks ---------------------------------------------------------


def test_queued_opens_kueues_ports_from_the_control_plane_to_the_nodes():
    rendered = render_stack("queued")
    (rule,) = rendered.of_type(FIREWALL)
    (cluster,) = rendered.of_type(CLUSTER)
    assert (rule.name, rule.parent) == ("gke-webhooks", "gke")  # a child of the Cluster
    inputs = rule.inputs
    assert inputs["network"] == cluster.inputs["network"]
    assert inputs["sourceRanges"] == [cluster.inputs["privateClusterConfig"]["masterIpv4CidrBlock"]]
    assert inputs["targetServiceAccounts"] == [cluster.inputs["nodeConfig"]["serviceAccount"]]
    assert inputs["direction"] == "INGRESS"
    (allow,) = inputs["allows"]
    expected = _ports("kueue") - set(webhooks.gke_admitted())
    assert allow["protocol"] == "tcp"
    assert {int(p) for p in allow["ports"]} == expected
    assert "9443" in allow["ports"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_only_kueues_webhook_needs_a_rule(stack):
    """Kueue's webhook (9443) is the one GKE's own rule does not admit: a stack that installs
    Kueue (a queued pool, a capacity ladder) gets the rule, one that does not gets none."""
    rendered = render_stack(stack)
    assert bool(rendered.of_type(FIREWALL)) == bool(rendered.plan.kueue_pools)


def _variant(stack: str, **values) -> object:
    base, secrets = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    base = copy.deepcopy(base)
    base.update(values)
    return run_program(base, stack, secrets)


def test_helm_kuberay_with_cert_manager_and_the_tpu_webhook_needs_no_rule():
    rendered = _variant("prod", **{"park:kuberay": {"install": "helm"}})
    releases = {r.inputs["name"] for r in rendered.of_type("kubernetes:helm.sh/v3:Release")}
    assert {"kuberay-operator", "cert-manager", "kuberay-tpu-webhook"} <= releases
    # the rule admits Kueue's port alone (prod's ladder installs it): none of KubeRay's
    (rule,) = rendered.of_type(FIREWALL)
    assert {int(p) for a in rule.inputs["allows"] for p in a["ports"]} == _ports("kueue") - set(
        webhooks.gke_admitted()
    )


def test_in_cluster_objects_wait_for_the_rule():
    rendered = render_stack("queued")
    (provider,) = rendered.of_type("pulumi:providers:kubernetes")
    assert "gke-webhooks" in provider.dependencies


def test_public_nodes_have_no_control_plane_range_to_admit():
    assert webhook_firewall("c", "172.16.0.0/28", False, [(9443, "kueue")]) is None
    assert webhook_firewall("c", "172.16.0.0/28", True, [(10250, "cert-manager")]) is None
    rule = webhook_firewall("c", "172.16.0.0/28", True, [(9443, "kueue"), (443, "x")])
    assert rule is not None and rule["allows"] == [{"protocol": "tcp", "ports": ["9443"]}]


# ---- against the Compute API's schema -------------------------------------------------------


def test_the_rule_matches_the_compute_api():
    assert gke_api.check_resources(render_stack("queued").resources) == []


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda i: i.update(direction="INBOUND"), "'INBOUND' is not one of the API's values"),
        (lambda i: i["allows"][0].update(port=["9443"]), "allowed[0].port: no such field"),
        (lambda i: i.update(sourceRange="10.0.0.0/8"), "Firewall.sourceRange: no such field"),
    ],
)
def test_the_compute_schema_catches_what_the_api_would_refuse(edit, fragment):
    (rule,) = render_stack("queued").of_type(FIREWALL)
    inputs = copy.deepcopy(rule.inputs)
    edit(inputs)
    problems = gke_api.check(FIREWALL, rule.name, inputs)
    assert any(fragment in p for p in problems), problems


def test_the_vendored_schema_is_the_discovery_documents_firewall():
    document = gke_api.compute_discovery()
    assert document["name"] == "compute" and document["version"] == "v1"
    firewall = document["schemas"]["Firewall"]["properties"]
    assert firewall["allowed"]["items"]["properties"]["IPProtocol"]["type"] == "string"
    assert Path(gke_api.COMPUTE_DISCOVERY).parent.joinpath("SOURCE.md").is_file()
