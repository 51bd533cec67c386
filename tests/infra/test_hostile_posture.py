"""Hostile and careless stack config (issue 20), continued: values checked as what they are
(3), posture on production stacks with the policy pack deciding the same way (5), and counts
bounded by what GKE holds (6)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from infra.plan.dashboard_access import dashboard_access
from infra.resolve import resolve
from infra.schema.read import parse_values
from infra.stack import from_values
from tests.infra.stack_problems import problems_of
from tests.infra.test_hostile_config import with_

DASHBOARD = {
    "exposeDashboard": True,
    "dashboardDomain": "ray.example.com",
    "iapMembers": ["group:ml@example.com"],
    "iapOauthClientId": "123456789012-abc123.apps.googleusercontent.com",
    "iapOauthSecret": "ray-dashboard-oauth",
}
PRIVATE = {"masterAuthorizedNetworks": [{"cidr": "203.0.113.0/24"}]}


# ---- 3. values as what they are; CEL built, not pasted ------------------------------------------

INJECTION = 'x" || true || "'


@pytest.mark.parametrize(
    ("field", "bad", "good"),
    [
        ("dashboardDomain", INJECTION, "ray.example.com"),
        ("dashboardDomain", "ray.example.com\nx", "a-b.c.example.org"),
        ("iapOauthSecret", "GOCSPX is not a name!", "ray-dashboard-oauth"),
        (
            "iapOauthClientId",
            "1-x.apps.googleusercontent.com@evil",
            "99-abc.apps.googleusercontent.com",
        ),
        ("iapMembers", ['user:a@example.com" || true'], ["user:a@example.com"]),
    ],
)
def test_dashboard_values_are_checked_as_what_they_are(field, bad, good):
    observability = {**DASHBOARD, field: bad}
    named = f"park:observability.{field}" + ("[0]" if isinstance(bad, list) else "")
    assert named in problems_of(with_("park:observability", observability))
    from_values(with_("park:observability", {**DASHBOARD, field: good}), "dev")


def test_the_iap_condition_is_a_cel_string_literal_even_for_a_value_no_rule_saw():
    """The plan quotes the domain itself: a crafted value stays one string literal."""
    spec = parse_values(
        with_("park:observability", {**DASHBOARD, "dashboardDomain": INJECTION}), "dev"
    )
    access = dashboard_access(resolve(spec, partial=True))
    assert access is not None
    expression = access.iap_condition["expression"]
    literal = re.fullmatch(r"request\.host == (.*)", expression)
    assert literal is not None and json.loads(literal.group(1)) == INJECTION
    good = parse_values(with_("park:observability", DASHBOARD), "dev")
    assert dashboard_access(resolve(good, partial=True)).iap_condition["expression"] == (  # type: ignore[union-attr]
        'request.host == "ray.example.com"'
    )


@pytest.mark.parametrize(
    ("path", "bad", "good"),
    [
        ("park:training.data", "gs://", "gs://my-bucket/data/train.jsonl"),
        ("park:training.model", "gs://UPPER/x", "gs://my-bucket/models/base"),
        (
            "park:serving.models.0.source",
            "Qwen/Qwen2.5 1.5B; rm -rf /",
            "Qwen/Qwen2.5-1.5B-Instruct",
        ),
        ("park:storage.mountPath", "/data\x1b[2J", "/data"),
    ],
)
def test_paths_and_uris_are_checked(path, bad, good):
    named = path.replace(".0.", "[0].")
    assert named in problems_of(with_(path, bad))
    from_values(with_(path, good), "dev")


# ---- 5. posture ---------------------------------------------------------------------------------

EXPOSED = [
    ("park:cluster", {"deletionProtection": True}, "park:cluster.masterAuthorizedNetworks"),
    ("park:cluster", {**PRIVATE, "privateNodes": False}, "park:cluster.privateNodes"),
    ("park:serving.exposePublicly", True, "park:serving.exposePublicly"),
]


@pytest.mark.parametrize(("path", "value", "key"), EXPOSED)
def test_exposure_is_refused_on_production_and_warned_elsewhere(path, value, key):
    exposed = with_(path, value, with_("park:cluster", PRIVATE))
    if path == "park:cluster":
        exposed = with_(path, value)
    exposure = {
        "park:cluster.masterAuthorizedNetworks": "control-plane",
        "park:cluster.privateNodes": "nodes",
        "park:serving.exposePublicly": "serving",
    }[key]
    assert "acknowledgePublic" in problems_of(exposed, "prod")[key]
    # deletion protection asked for explicitly marks production too
    if "deletionProtection" not in json.dumps(value):
        marked = copy.deepcopy(exposed)
        marked["park:cluster"] = {**marked.get("park:cluster", {}), "deletionProtection": True}
        assert key in problems_of(marked, "dev")
    acknowledged = {**exposed, "park:policy": {"acknowledgePublic": [exposure]}}
    plan = from_values(acknowledged, "prod")
    assert key in {w.key for w in plan.warnings}
    casual = copy.deepcopy(exposed)
    casual.setdefault("park:cluster", {})["deletionProtection"] = False
    assert key in {w.key for w in from_values(casual, "dev").warnings}


def test_a_private_production_stack_passes_without_a_word():
    plan = from_values(with_("park:cluster", PRIVATE), "prod")
    assert not [w for w in plan.warnings if "acknowledgePublic" in w.message]


def test_the_policy_pack_decides_exposure_as_park_validate_does():
    """The same verdict on the rendered resources: refused on production, not elsewhere."""
    pytest.importorskip("pulumi_policy")
    from infra.schema.models import ClusterConfig, PolicyConfig
    from infra.tools.render import run_program
    from policy.harness import evaluate
    from policy.rules import settings_from

    public = with_("park:cluster", {**PRIVATE, "privateNodes": False, "deletionProtection": False})
    rendered = run_program(public, "dev")  # valid: a warning on a dev stack
    records = [r.as_json() for r in rendered.resources]
    dev = settings_from(PolicyConfig(), "dev", ClusterConfig(deletionProtection=False))
    assert not [v for v in evaluate(records, "dev", dev) if v.rule == "gke-private-nodes"]
    prod = settings_from(PolicyConfig(), "prod", ClusterConfig())
    refused = [v for v in evaluate(records, "prod", prod) if v.rule == "gke-private-nodes"]
    assert refused and all("acknowledgePublic" in v.message for v in refused)
    acked = settings_from(PolicyConfig(acknowledge_public=["nodes"]), "prod", ClusterConfig())
    assert not [v for v in evaluate(records, "prod", acked) if v.rule == "gke-private-nodes"]


# ---- 6. counts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "bad", "good"),
    [
        ("park:tpuPools.0.slices", 1_000_000, 2),
        ("park:cpuPool", {"maxNodes": 100_000}, {"maxNodes": 10}),
    ],
)
def test_absurd_counts_are_refused(path, bad, good):
    named = "park:tpuPools[0].slices" if "slices" in path else "park:cpuPool.maxNodes"
    assert named in problems_of(with_(path, bad))
    from_values(with_(path, good), "dev")


def test_max_model_len_is_held_to_the_models_positions():
    problems = problems_of(with_("park:serving.models.0.maxModelLen", 10_000_000))
    assert "park:serving.models[0].maxModelLen" in problems
