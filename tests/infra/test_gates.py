"""Readiness gates (infra/plan/gates.py, infra/components/gates.py): recorded in every shipped
stack's resources.json, what needs them depends on them, bounded, least privilege, and the CRD
names they wait for are the vendored CRDs' own."""

from __future__ import annotations

import copy

import pytest
import yaml

from infra.datafile import YAML_LOADER
from infra.plan import gates
from infra.schema.read import read_stack_file
from infra.tools.render import run_program
from infra.tools.schemas import SCHEMA_DIR, crd_schemas, validate_manifests
from tests.conftest import SHIPPED_STACKS, STACKS_DIR
from tests.infra.goldens import golden_manifests, golden_resources

GATED_KINDS = ("RayJob", "RayService", "ClusterQueue")
JOB = "kubernetes:batch/v1:Job"


def _golden(stack: str) -> tuple[list[dict], dict[str, dict]]:
    return golden_resources(stack), golden_manifests(stack)


def _gates(resources: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in resources if r["name"].endswith("-ready") and r["type"] == JOB}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_rayjob_rayservice_and_clusterqueue_depends_on_a_ready_gate(stack):
    resources, _ = _golden(stack)
    gated = [r for r in resources if r["type"].rsplit(":", 1)[-1] in GATED_KINDS]
    assert any(r["type"].endswith(":RayJob") or r["type"].endswith(":RayService") for r in gated)
    ready = _gates(resources)
    for resource in gated:
        waits = [d for d in resource["dependsOn"] if d in ready]
        assert waits, f"{stack}: {resource['name']} depends on no *-ready gate"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_object_of_a_custom_kind_waits_for_its_gate(stack):
    resources, _ = _golden(stack)
    ready = _gates(resources)
    kinds = {kind for _, kind in gates.CRDS}
    for resource in resources:
        kind = resource["type"].rsplit(":", 1)[-1]
        if resource["type"].startswith("kubernetes:") and kind in kinds:
            assert set(resource["dependsOn"]) & set(ready), resource["name"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_gate_is_bounded_and_its_own_least_privilege(stack):
    resources, manifests = _golden(stack)
    assert _gates(resources), stack
    for job in (m for m in manifests.values() if m["kind"] == "Job"):
        if job["metadata"]["labels"].get("app.kubernetes.io/name") != "park-ready-gate":
            continue
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        command = container["command"]
        assert command[:3] == ["python", "-m", gates.GATE_MODULE]
        wait_s = int(command[command.index("--deadline-s") + 1])
        assert spec["activeDeadlineSeconds"] == gates.START_S + wait_s
        assert spec["backoffLimit"] == gates.RETRIES
        assert pod["automountServiceAccountToken"] is True
        account = pod["serviceAccountName"]
        assert account != f"park-{stack}-workload"  # not the bucket's identity
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        crds = [command[i + 1] for i, w in enumerate(command) if w == "--crd"]
        role = manifests.get(f"clusterrole-{account}.yaml")
        if crds:
            (rule,) = [r for r in role["rules"] if r["apiGroups"] == ["apiextensions.k8s.io"]]
            assert rule == {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "resourceNames": crds,
                "verbs": ["get"],
            }
        for rule in (role or {}).get("rules", []):
            assert rule["verbs"] in (["get"], ["create"]) and "*" not in str(rule)


def test_crd_names_are_the_vendored_crds_own():
    vendored = {}
    for path in SCHEMA_DIR.rglob("*.yaml"):
        for doc in yaml.load_all(path.read_text(), Loader=YAML_LOADER):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                spec = doc["spec"]
                vendored[(spec["group"], spec["names"]["kind"])] = doc["metadata"]["name"]
    for key, name in gates.CRDS.items():
        assert vendored[key] == name


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_custom_kind_a_stack_creates_is_gated(stack):
    """A new custom kind without a gate fails here: it is a vendored CRD's kind, and neither in
    gates.CRDS nor Kueue's (gated by its webhook's probe)."""
    _, manifests = _golden(stack)
    custom = {(m["apiVersion"], m["kind"]) for m in manifests.values()} & set(crd_schemas())
    for api_version, kind in custom:
        group = api_version.rpartition("/")[0]
        assert (group, kind) in gates.CRDS or group == gates.KUEUE_PROBE.group, kind


def test_kueue_probe_is_a_valid_cluster_queue():
    body = {**gates.KUEUE_PROBE.body, "metadata": {"name": "park-ready-probe-x"}}
    assert validate_manifests([body]) == []
    assert gates.KUEUE_PROBE.path == "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"


def _helm_multi_host():
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.prod.yaml")
    values = copy.deepcopy(values)
    values["park:kuberay"] = {"install": "helm"}
    return run_program(values, "prod", secrets)


def test_helm_path_waits_for_cert_manager_before_the_tpu_webhook():
    rendered = _helm_multi_host()
    releases = {r.inputs["name"]: r for r in rendered.of_type("kubernetes:helm.sh/v3:Release")}
    (gate,) = [r for r in rendered.of_type(JOB) if r.name == "kuberay-cert-manager-ready"]
    assert releases["cert-manager"].name in gate.dependencies
    assert gate.name in releases["kuberay-tpu-webhook"].dependencies
    (crds,) = [r for r in rendered.of_type(JOB) if r.name == "kuberay-ready"]
    kuberay = {r.name for name, r in releases.items() if name != "kueue"}  # prod's ladder's
    assert kuberay <= set(crds.dependencies)
    command = gate.inputs["spec"]["template"]["spec"]["containers"][0]["command"]
    path = command[command.index("--dry-run") + 1]
    assert path == "/apis/cert-manager.io/v1/namespaces/park/issuers"
    # namespaced: a Role in the gate's namespace, no cluster-wide create
    objects = {(m["kind"], m["metadata"]["name"]): m for m in rendered.manifests()}
    role = objects[("Role", "park-cert-manager-ready")]
    assert role["metadata"]["namespace"] == "park"
    assert role["rules"] == [
        {"apiGroups": ["cert-manager.io"], "resources": ["issuers"], "verbs": ["create"]}
    ]
    assert ("ClusterRole", "park-cert-manager-ready") not in objects
    assert validate_manifests(rendered.manifests()) == []


def test_no_workload_no_gate(rendered):
    """Gates run a workload's image: each shipped stack has one, and gates only as it needs."""
    names = {r.name for r in rendered.of_type(JOB) if r.name.endswith("-ready")}
    assert "kuberay-ready" in names
    assert ("kueue-ready" in names) == bool(rendered.plan.kueue_pools)
    assert ("dashboard-ready" in names) == rendered.config.observability.expose_dashboard


def test_gate_objects_are_named_after_their_namespace():
    gate = gates.gate("kueue", "x", "ml", dry_runs=(gates.KUEUE_PROBE,), wait_s=5)
    assert {m["metadata"]["name"] for m in gate.manifests} == {"ml-kueue-ready"}
    assert gate.timeout_s == gates.START_S + 5 == gate.job["spec"]["activeDeadlineSeconds"]
    assert [m["kind"] for m in gate.rbac] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]


def test_validate_states_each_gate_and_its_bound(rendered):
    from infra.tools.report import first_deploy_table

    table = first_deploy_table(rendered.plan)
    what, why = (list(c.cells) for c in table.columns)
    for planned in gates.stack_gates(rendered.plan).all():
        row = what.index(f"gate {planned.job['metadata']['name']}")
        assert f"Job deadline {planned.timeout_s // 60} min" in why[row]
