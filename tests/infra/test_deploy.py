"""The first real `pulumi up` succeeds: GKE API fidelity, stacks sharing a project, Ray pods the
operator can reach, in-cluster resources that wait for nodes, CI that reaches the cluster.

Each test holds the rendered program against a reference nobody here wrote where one exists:
GKE's API discovery document, Kubernetes' NetworkPolicy semantics, GKE's naming rules.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import names
from infra.plan import cluster as cluster_plan
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from infra.tools import gke_api
from infra.tools.netpol import Peer, Pod, allowed, flow_problems
from infra.tools.render import run_program
from tests.conftest import ROOT, SHIPPED_STACKS, STACKS_DIR, render_stack

NODE_POOL = "gcp:container/nodePool:NodePool"


def _values(stack: str) -> tuple[dict, list[str]]:
    values, secrets = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    return copy.deepcopy(values), secrets


def _variant(stack: str, **changes) -> object:
    values, secrets = _values(stack)
    for key, value in changes.items():
        values[key.replace("__", ":")] = value
    return run_program(values, stack, secrets)


# ---- 1. the cluster version ----------------------------------------------------------------


def test_shipped_stacks_follow_their_release_channel(rendered):
    (cluster,) = rendered.of_type("gcp:container/cluster:Cluster")
    assert "minMasterVersion" not in cluster.inputs
    assert rendered.config.cluster.version is None
    assert cluster.inputs["releaseChannel"]["channel"] in ("RAPID", "REGULAR", "STABLE")


@pytest.mark.parametrize(
    ("cluster", "pools_capacity", "fragment"),
    [
        ({"version": "1.31.2-gke.1115000"}, "on-demand", "older than release channel REGULAR"),
        ({"releaseChannel": "STABLE", "version": "1.31"}, "on-demand", "oldest minor 1.32"),
        (
            {"releaseChannel": "EXTENDED", "version": "1.32.9-gke.1"},
            "flex-start",
            "flex-start TPU capacity (pool p) needs GKE ≥ 1.33.0-gke.1712000",
        ),
        (
            {"releaseChannel": "EXTENDED", "version": "1.32"},
            "queued",
            "queued TPU capacity (pool p) needs GKE ≥ 1.33.0-gke.1712000",
        ),
    ],
)
def test_a_pinned_version_is_checked_before_any_api_call(cluster, pools_capacity, fragment):
    values = {
        "gcp:project": "p",
        "gcp:region": "us-east5",
        "park:zone": "us-east5-b",
        "park:cluster": cluster,
        "park:tpuPools": [
            {
                "name": "p",
                "machineType": "ct6e-standard-8t",
                "topology": "2x4",
                "capacity": pools_capacity,
            }
        ],
    }
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    messages = [p.message for p in info.value.problems if p.key == "park:cluster.version"]
    assert any(fragment in m for m in messages), messages


def test_a_minor_pin_passes_and_an_exact_patch_warns():
    base = {"gcp:project": "p", "gcp:region": "us-east5", "park:zone": "us-east5-b"}
    plan = from_values({**base, "park:cluster": {"version": "1.35"}}, "dev")
    versions = [w for w in plan.warnings if w.key == "park:cluster.version"]
    assert versions == [] and str(plan.cluster_version) == "1.35"
    plan = from_values({**base, "park:cluster": {"version": "1.35.8-gke.1036000"}}, "dev")
    (warning,) = [w for w in plan.warnings if w.key == "park:cluster.version"]
    assert warning.key == "park:cluster.version" and "pin the minor (1.35)" in warning.message


# ---- 2. Workload Identity waits for its pool -----------------------------------------------


def test_workload_identity_binding_waits_for_the_cluster(rendered):
    (binding,) = rendered.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert binding.inputs["member"].startswith("serviceAccount:my-gcp-project.svc.id.goog[")
    assert "gke" in binding.dependencies  # the cluster creates the project's identity pool


# ---- 3. stacks that share a project --------------------------------------------------------

# (type, input) of every project-scoped name the program creates
PROJECT_SCOPED = [
    ("gcp:serviceaccount/account:Account", "accountId"),
    ("gcp:artifactregistry/repository:Repository", "repositoryId"),
    ("gcp:storage/bucket:Bucket", "name"),
    ("gcp:logging/metric:Metric", "name"),
    ("gcp:compute/network:Network", "name"),
    ("gcp:compute/subnetwork:Subnetwork", "name"),
    ("gcp:compute/router:Router", "name"),
    ("gcp:compute/routerNat:RouterNat", "name"),
    ("gcp:compute/globalAddress:GlobalAddress", "name"),
    ("gcp:compute/managedSslCertificate:ManagedSslCertificate", "name"),
]


def _project_scoped(rendered) -> dict[str, set]:
    found: dict[str, set] = {"principal": set(), "iap grant": set()}
    for type_token, field in PROJECT_SCOPED:
        found[type_token] = {r.inputs[field] for r in rendered.of_type(type_token)}
    for binding in rendered.of_type("gcp:serviceaccount/iAMMember:IAMMember"):
        found["principal"].add(binding.inputs["member"])  # PROJECT.svc.id.goog[ns/ksa]
    for grant in rendered.of_type("gcp:iap/webIamMember:WebIamMember"):
        key = (grant.inputs["role"], grant.inputs["member"], str(grant.inputs.get("condition")))
        found["iap grant"].add(key)
    return found


def test_every_shipped_stack_in_one_project_shares_no_project_scoped_name():
    """All shipped stacks render with the same gcp:project; a name (or a Workload Identity
    principal, the same for one ns/KSA in every cluster of a project) in two of them would be
    a 409 on the second `pulumi up`, or dev's pods holding prod's bucket."""
    seen: dict[tuple[str, object], str] = {}
    for stack in SHIPPED_STACKS:
        rendered = render_stack(stack)
        assert rendered.config.project == "my-gcp-project"
        for kind, values in _project_scoped(rendered).items():
            for value in values:
                other = seen.setdefault((kind, value), stack)
                assert other == stack, f"{kind} {value!r} is in stacks {other} and {stack}"
    principals = {k for k in seen if k[0] == "principal"}
    assert len(principals) == len(SHIPPED_STACKS)


def test_sharing_a_registry_is_explicit():
    rendered = _variant("dev", park__registry={"repository": "park-shared", "create": False})
    assert not rendered.of_type("gcp:artifactregistry/repository:Repository")
    (grant,) = rendered.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert grant.inputs["repository"] == "park-shared"
    job = next(m for m in rendered.manifests() if m["kind"] == "RayJob")
    image = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "/park-shared/park-workloads:" in image["image"]


@pytest.mark.parametrize(
    "prefix", ["park-dev", "park-" + "x" * 40, "park-" + "x" * 40 + "y", "park-a-b-c-" * 5]
)
def test_service_account_ids_are_valid_and_unique(prefix):
    ids = {names.service_account_id(prefix, role) for role in ("nodes", "workload")}
    assert len(ids) == 2
    for account_id in ids:
        # IAM's rule for accountId: 6-30 characters, [a-z]([-a-z0-9]*[a-z0-9])
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])", account_id), account_id
        assert 6 <= len(account_id) <= 30, account_id
    long_a = names.service_account_id("park-" + "x" * 40, "nodes")
    long_b = names.service_account_id("park-" + "x" * 40 + "y", "nodes")
    assert long_a != long_b  # the same 30-character head, told apart by the hash


# ---- 4. the NetworkPolicy against the flows Ray on GKE needs --------------------------------

POLICY_VARIANTS = {
    "helm": {"park__kuberay": {"install": "helm"}},
    "public serve": {"park__serving": "expose"},
}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_needed_flow_is_allowed_and_nothing_else(stack):
    rendered = render_stack(stack)
    assert flow_problems(rendered.manifests(), rendered.plan) == []


def _helm_or_public(variant: str):
    values, secrets = _values("prod")
    if variant == "helm":
        values["park:kuberay"] = {"install": "helm"}
    else:  # prod is a production stack: a public endpoint must be acknowledged
        values["park:serving"] = {**values["park:serving"], "exposePublicly": True}
        values["park:policy"] = {**values.get("park:policy", {}), "acknowledgePublic": ["serving"]}
    return run_program(values, "prod", secrets)


@pytest.mark.parametrize("variant", ["helm", "public serve"])
def test_flows_hold_for_the_helm_operator_and_a_public_endpoint(variant):
    rendered = _helm_or_public(variant)
    assert flow_problems(rendered.manifests(), rendered.plan) == []


def test_the_old_policy_locked_the_operator_out():
    """The policy before this fix (same namespace, 8000 from anywhere in the cluster, 8080 from
    gmp-system) refuses the add-on operator's calls to the head's dashboard."""
    rendered = render_stack("dev")
    manifests = [m for m in rendered.manifests() if m["kind"] != "NetworkPolicy"]
    old = copy.deepcopy(next(m for m in rendered.manifests() if m["kind"] == "NetworkPolicy"))
    old["spec"]["ingress"] = [
        {"from": [{"podSelector": {}}]},
        {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]},
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8080}],
        },
    ]
    problems = flow_problems([*manifests, old], rendered.plan)
    assert any("add-on operator, API proxy → dashboard" in p and "refused" in p for p in problems)


def test_network_policy_semantics_follow_kubernetes():
    """The evaluator on the Kubernetes docs' own distinctions: one peer with both selectors is an
    AND, two peers an OR; ipBlock except; named ports; an unselected pod is not isolated."""
    pod = Pod("prod", {"role": "db"}, {"pg": 5432})
    both = {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}
    policy = {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": "prod"},
        "spec": {
            "podSelector": {
                "matchExpressions": [{"key": "role", "operator": "In", "values": ["db"]}]
            },
            "ingress": [
                {"from": [{**both, "podSelector": {"matchLabels": {"app": "api"}}}]},
                {
                    "from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                    "ports": [{"port": "pg"}],
                },
            ],
        },
    }
    team_a = {"team": "a"}
    assert allowed([policy], Peer("x", {"app": "api"}, team_a), pod, 1)[0]
    assert not allowed([policy], Peer("x", {"app": "web"}, team_a), pod, 1)[0]  # AND
    assert not allowed([policy], Peer("prod", {"app": "api"}), pod, 1)[0]
    assert allowed([policy], Peer(ip="10.2.3.4"), pod, 5432)[0]
    assert not allowed([policy], Peer(ip="10.1.3.4"), pod, 5432)[0]  # except
    assert not allowed([policy], Peer(ip="10.2.3.4"), pod, 5433)[0]  # named port pg only
    assert allowed([policy], Peer("x", {}), Pod("prod", {"role": "web"}), 1)[0]  # not selected


# ---- 5. nothing in the cluster before the system pool ----------------------------------------


def _depends_on(rendered, name: str, seen: set[str] | None = None) -> set[str]:
    """Everything a resource waits for, through its dependencies' dependencies."""
    seen = set() if seen is None else seen
    for resource in (r for r in rendered.resources if r.name == name):  # names may repeat
        for dep in resource.dependencies:
            if dep not in seen:
                seen.add(dep)
                _depends_on(rendered, dep, seen)
    return seen


def test_in_cluster_resources_wait_for_the_system_pool(rendered):
    cpu = next(r for r in rendered.of_type(NODE_POOL) if r.parent == "cpu")
    for resource in rendered.resources:
        if (
            resource.custom
            and resource.type.startswith("kubernetes:")
            and not (resource.type.startswith("pulumi:providers"))
        ):
            assert cpu.name in _depends_on(rendered, resource.name), resource.name


def test_helm_releases_wait_for_the_system_pool():
    rendered = _helm_or_public("helm")
    for release in rendered.of_type("kubernetes:helm.sh/v3:Release"):
        assert "cpu" in _depends_on(rendered, release.name), release.name


# ---- 6. queued pools are flex-start pools ----------------------------------------------------


def test_queued_pools_ask_for_flex_start_and_queued_provisioning():
    rendered = render_stack("queued")
    queued = [r for r in rendered.of_type(NODE_POOL) if "queuedProvisioning" in r.inputs]
    assert queued
    for pool in queued:
        config = pool.inputs["nodeConfig"]
        assert config["flexStart"] is True
        assert config["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
        assert pool.inputs["management"]["autoRepair"] is False
        assert pool.inputs["autoscaling"]["minNodeCount"] == 0


# ---- 7. CI reaches the cluster ---------------------------------------------------------------


def test_the_kubeconfig_uses_the_dns_endpoint(rendered):
    (cluster,) = rendered.of_type("gcp:container/cluster:Cluster")
    assert cluster.inputs["controlPlaneEndpointsConfig"] == {
        "dnsEndpointConfig": {"allowExternalTraffic": True}
    }
    plan = cluster_plan.cluster(rendered.plan)
    assert plan.dns_endpoint
    config = yaml.safe_load(cluster_plan.kubeconfig("c", "gke-1.us-east5.gke.goog", None))
    (entry,) = config["clusters"]
    assert entry["cluster"] == {"server": "https://gke-1.us-east5.gke.goog"}  # public CA
    (user,) = config["users"]
    assert user["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"


@pytest.mark.parametrize("workflow", ["deploy.yml", "pull-request.yml"])
def test_workflows_install_the_auth_plugin_before_pulumi(workflow):
    document = yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())
    pulumi_jobs = 0
    for job in document["jobs"].values():
        steps = [s.get("uses", "") for s in job.get("steps", [])]
        if not any(u.startswith("pulumi/actions") for u in steps):
            continue
        pulumi_jobs += 1
        at = next(i for i, u in enumerate(steps) if u.startswith("pulumi/actions"))
        auth = [i for i, u in enumerate(steps) if u.startswith("google-github-actions/auth@")]
        gcloud = [
            i
            for i, step in enumerate(job["steps"])
            if step.get("uses", "").startswith("google-github-actions/setup-gcloud@")
            and "gke-gcloud-auth-plugin" in str((step.get("with") or {}).get("install_components"))
        ]
        assert auth and auth[0] < at, "OIDC credentials before pulumi"
        assert gcloud and gcloud[0] < at, "gke-gcloud-auth-plugin before pulumi"
        assert job.get("permissions", document.get("permissions", {})).get("id-token") == "write"
    assert pulumi_jobs >= 1


# ---- the GKE API's own schema ----------------------------------------------------------------


GKE_VARIANTS = {
    "flex-start pool": {
        "park:tpuPools": [
            {"name": "t", "machineType": "ct6e-standard-8t", "topology": "2x4"},
            {
                "name": "flex",
                "machineType": "ct6e-standard-4t",
                "topology": "4x4",
                "capacity": "flex-start",
                "maxRunDuration": "86400s",
            },
        ]
    },
    "GPU pools": {
        "park:gpuPools": [
            {
                "name": "h200",
                "machineType": "a3-ultragpu-8g",
                "acceleratorType": "nvidia-h200-141gb",
            },
            {
                "name": "l4",
                "machineType": "g2-standard-8",
                "acceleratorType": "nvidia-l4",
                "acceleratorCount": 1,
                "capacity": "spot",
                "autoscaling": False,
            },
        ]
    },
    "helm, private endpoint, no DNS": {
        "park:kuberay": {"install": "helm"},
        "park:cluster": {"privateEndpoint": True, "dnsEndpoint": False, "version": "1.35"},
    },
}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_clusters_and_node_pools_match_the_gke_api(stack):
    problems = gke_api.check_resources(render_stack(stack).resources)
    assert problems == []


@pytest.mark.parametrize("variant", sorted(GKE_VARIANTS))
def test_variants_no_shipped_stack_uses_match_the_gke_api(variant):
    values, secrets = _values("dev")
    values.update(copy.deepcopy(GKE_VARIANTS[variant]))
    for key in ("park:training", "park:serving"):
        values[key] = {"enabled": False}
    rendered = run_program(values, "dev", secrets)
    assert gke_api.check_resources(rendered.resources) == []
    pools = {r.name: r.inputs for r in rendered.of_type(NODE_POOL)}
    if variant == "flex-start pool":
        assert gke_api.node_pool_body(pools["flex-s0"])["config"]["flexStart"] is True
    if variant == "GPU pools":
        (accelerator,) = gke_api.node_pool_body(pools["h200"])["config"]["accelerators"]
        assert accelerator["acceleratorType"] == "nvidia-h200-141gb"


@pytest.mark.parametrize(
    ("type_token", "edit", "fragment"),
    [
        (NODE_POOL, lambda i: i["nodeConfig"].update(spots=True), "no such field"),
        (
            NODE_POOL,
            lambda i: i["nodeConfig"]["taints"][0].update(effect="NoSchedule"),
            "is not one of the API's values",
        ),
        (
            "gcp:container/cluster:Cluster",
            lambda i: i["releaseChannel"].update(channel="FAST"),
            "'FAST' is not one of the API's values",
        ),
        (
            "gcp:container/cluster:Cluster",
            lambda i: i.update(datapathProvider="CILIUM"),
            "networkConfig.datapathProvider",
        ),
        (  # a field the discovery document marks `deprecated`
            "gcp:container/cluster:Cluster",
            lambda i: i["securityPostureConfig"].update(vulnerabilityMode="VULNERABILITY_BASIC"),
            "vulnerabilityMode: deprecated in the API: Vulnerability scanning is no longer",
        ),
        (  # an enum value the discovery document marks in `enumDeprecated`
            "gcp:container/cluster:Cluster",
            lambda i: i["securityPostureConfig"].update(mode="ENTERPRISE"),
            "'ENTERPRISE' is deprecated in the API",
        ),
    ],
)
def test_the_api_schema_catches_what_the_provider_would_send_in_vain(type_token, edit, fragment):
    resource = next(
        r
        for r in render_stack("queued").resources
        if r.type == type_token and r.name in ("gke", "train-v6e-16-s0")
    )
    inputs = copy.deepcopy(resource.inputs)
    edit(inputs)
    problems = gke_api.check(type_token, resource.name, inputs)
    assert any(fragment in p for p in problems), problems


# ---- 9. no secret values in stack files; bad files fail in one line --------------------------


def test_no_stack_file_ships_a_secret_value():
    for path in STACKS_DIR.glob("Pulumi.*.yaml"):
        assert "secure:" not in path.read_text(), path


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        (b"config:\n  gcp:project: [open\n", 3, "not YAML"),
        (b"config:\n  gcp:project: caf\xe9\n", 2, "not UTF-8"),
        (b"- a\n- b\n", 1, "a YAML mapping"),
        (b"# c\nconfig: 5\n", 2, "`config:` must be a mapping"),
    ],
)
def test_a_broken_stack_file_is_one_line_with_file_and_line(tmp_path, content, line, fragment):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "infra.tools.cli", "validate", "bad", "--config-file", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    (error,) = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert f"{path}:{line}:" in error and fragment in error


def test_an_unknown_key_never_echoes_a_token(tmp_path):
    token = "hf_" + "a1B2" * 10
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(
        "config:\n  gcp:project: p\n  gcp:region: us-east5\n  park:zone: us-east5-b\n"
        f"  park:hfToken: {token}\n  park:serving:\n    enabled: true\n    hfTokn: {token}\n"
    )
    for command in ("validate", "render", "cost"):
        done = subprocess.run(
            [sys.executable, "-m", "infra.tools.cli", command, "t", "--config-file", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert done.returncode == 1
        assert token not in done.stdout + done.stderr
        assert "park:hfToken" in done.stdout + done.stderr


def test_the_deploy_page_says_how_to_share_a_project_and_reach_the_cluster():
    section = (ROOT / "docs" / "deploy.md").read_text()
    for needed in ("park:registry", "dnsEndpoint", "gke-gcloud-auth-plugin", "releaseChannel"):
        assert needed in section, needed
    assert Path(ROOT / ".github" / "workflows" / "deploy.yml").exists()
