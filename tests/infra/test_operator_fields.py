"""The KubeRay we validate against is the one that runs (issue 27, item 9).

Every RayJob/RayService field a shipped stack emits must be declared by the KubeRay that runs
it, or the API server prunes it silently. The field → first-release table
(infra/data/kuberay_fields.yaml) was read from KubeRay's own CRDs at every release tag; here it
is held to the vendored KubeRay 1.7.0 CRDs (infra/schemas/kuberay-v1.7.0), and the shipped
stacks' rendered objects are held to it for the KubeRay their cluster version's add-on is taken
to run (infra/data/gke.yaml: Google publishes none).
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import gke, kuberay
from infra.datafile import YAML_LOADER
from infra.rules.operator import ray_manifests, running_kuberay
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from infra.tools.render import run_program
from tests.conftest import ROOT, SHIPPED_STACKS, STACKS_DIR, render_stack

CRDS = ROOT / "infra" / "schemas" / "kuberay-v1.7.0"
RAY_KINDS = {"RayJob": "ray.io_rayjobs.yaml", "RayService": "ray.io_rayservices.yaml"}
TABLE = yaml.safe_load((ROOT / "infra" / "data" / "kuberay_fields.yaml").read_text())


def _spec_schema(kind: str) -> dict[str, Any]:
    # libyaml's safe loader where PyYAML has it, as infra/tools/schemas.py reads the CRDs
    crd = yaml.load((CRDS / RAY_KINDS[kind]).read_text(), Loader=YAML_LOADER)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The 1.7.0 schema node of a recorded path (`.a[].b`); None where the CRD has none, and
    never through a map (additionalProperties)."""
    node: dict[str, Any] | None = schema
    for token in path.replace("[]", ".[]").split(".")[1:]:
        if node is None:
            return None
        node = node.get("items") if token == "[]" else (node.get("properties") or {}).get(token)
    return node


def _absolute(kind: str) -> dict[str, str]:
    """Every recorded path of `kind`, through the anchors, as a path under its spec."""
    out = {path: since for path, since in TABLE["since"][kind].items()}
    for anchor, shared in TABLE["anchors"].get(kind, {}).items():
        for path, since in _absolute(shared).items():
            out[anchor + path] = since
    return out


# ---- the table against KubeRay 1.7.0's own CRDs ----------------------------------------------


@pytest.mark.parametrize("kind", sorted(RAY_KINDS))
def test_every_recorded_field_is_in_kuberay_1_7_0s_crd(kind):
    schema = _spec_schema(kind)
    paths = _absolute(kind)
    assert len(paths) > 50  # the shared types expanded at each place they sit
    missing = [p for p in paths if _schema_at(schema, p) is None]
    assert missing == []
    for anchor in TABLE["anchors"].get(kind, {}):  # a shared type is where the table says
        assert _schema_at(schema, anchor) is not None, anchor


def test_the_table_is_ordered_by_kuberays_releases():
    releases = kuberay.releases()
    assert next(iter(releases)) == kuberay.baseline() == "1.0.0"
    assert kuberay.newest() == "1.7.0"  # the release the CRDs are vendored from
    assert (CRDS / "SOURCE.md").read_text().count("v1.7.0") >= 1
    for group, rows in TABLE["since"].items():
        for path, since in rows.items():
            assert since in releases and since != kuberay.baseline(), (group, path)
            assert "{}" not in path  # no field under a map: map keys need no lookup


# ---- how a manifest's fields are read --------------------------------------------------------


def _job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"}, "spec": spec}


def test_fields_under_shared_types_are_found_where_they_sit():
    job = _job(
        entrypoint="python x.py",
        submitterPodTemplate={"spec": {"hostUsers": False, "nodeSelector": {"hostUsers": "x"}}},
        rayClusterSpec={
            "workerGroupSpecs": [{"groupName": "w", "numOfHosts": 4, "template": {"spec": {}}}],
            "headGroupSpec": {"template": {"spec": {"resources": {"limits": {"cpu": "1"}}}}},
        },
    )
    found = {f.path: f.since for f in kuberay.new_fields(job)}
    assert found == {
        "spec.submitterPodTemplate.spec.hostUsers": "1.1.0",
        "spec.rayClusterSpec.workerGroupSpecs[].numOfHosts": "1.1.0",
        "spec.rayClusterSpec.headGroupSpec.template.spec.resources": "1.3.1",  # pod-level
    }
    assert [f.path for f in kuberay.unknown_fields(job, "1.3.0")] == [
        "spec.rayClusterSpec.headGroupSpec.template.spec.resources"
    ]
    assert kuberay.unknown_fields(job, "1.3.1") == []


def test_a_subtree_counts_once_at_its_root_and_again_where_it_grew():
    job = _job(deletionStrategy={"deletionRules": [{"condition": {"jobDeploymentStatus": "x"}}]})
    found = {f.path: f.since for f in kuberay.new_fields(job)}
    assert found == {
        "spec.deletionStrategy": "1.5.0",
        "spec.deletionStrategy.deletionRules[].condition.jobDeploymentStatus": "1.6.0",
    }


# ---- the shipped stacks against the KubeRay that runs them -----------------------------------


def _ray_objects(rendered) -> list[dict[str, Any]]:
    return [m for m in rendered.manifests() if m["kind"] in RAY_KINDS]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_emitted_ray_field_is_known_to_the_kuberay_that_runs_it(stack):
    rendered = render_stack(stack)
    running, _ = running_kuberay(rendered.plan)
    objects = _ray_objects(rendered)
    assert objects
    newer = [f for m in objects for f in kuberay.new_fields(m)]
    assert {f.path for f in newer} >= {"spec.rayClusterSpec.workerGroupSpecs[].numOfHosts"} or {
        f.path for f in newer
    } >= {"spec.rayClusterConfig.workerGroupSpecs[].numOfHosts"}
    for manifest in objects:
        assert kuberay.unknown_fields(manifest, running) == [], manifest["metadata"]["name"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_rule_reads_the_objects_the_program_sends(stack):
    """The rule builds the RayJob/RayService from the plan; their newer fields are those of
    the rendered objects (what the components send after adding their own)."""
    rendered = render_stack(stack)
    planned = {
        (m["kind"], f.path, f.since)
        for m in ray_manifests(rendered.plan)
        for f in kuberay.new_fields(m)
    }
    sent = {
        (m["kind"], f.path, f.since) for m in _ray_objects(rendered) for f in kuberay.new_fields(m)
    }
    assert planned == sent


def _values(stack: str, **changes: Any) -> tuple[dict[str, Any], list[str]]:
    values, secrets = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    values = copy.deepcopy(values)
    for key, change in changes.items():
        values[key] = {**values.get(key, {}), **change}
    return values, secrets


def test_a_cluster_version_whose_add_on_lacks_a_field_is_refused_at_preview():
    values, secrets = _values(
        "dev", **{"park:cluster": {"releaseChannel": "EXTENDED", "version": "1.33"}}
    )
    with pytest.raises(ConfigError) as refused:
        from_values(values, "dev", secrets)
    (problem,) = refused.value.problems
    assert (problem.key, problem.value) == ("park:cluster.version", "1.33")
    assert "RayService park-serve's spec.upgradeStrategy (KubeRay ≥ 1.3.0)" in problem.message
    assert "GKE ≥ 1.34" in problem.message and "park:kuberay.install: helm" in problem.message
    # the same refusal reaches `pulumi preview` before any resource exists
    with pytest.raises(Exception, match=r"spec\.upgradeStrategy"):
        run_program(values, "dev", secrets)


def test_an_older_add_on_loses_more_and_says_each():
    values, secrets = _values(
        "prod", **{"park:cluster": {"releaseChannel": "EXTENDED", "version": "1.32"}}
    )
    # training on its reservation alone: the ladder's queued rung needs GKE 1.33 by itself
    train = values["park:tpuPools"][0]
    train.update(train.pop("ladder")[0])
    with pytest.raises(ConfigError) as refused:
        from_values(values, "prod", secrets)
    messages = " | ".join(p.message for p in refused.value.problems)
    assert "RayJob park-train's spec.backoffLimit (KubeRay ≥ 1.2.0)" in messages
    assert "GKE ≥ 1.33" in messages


def test_the_helm_charts_version_is_held_to_the_same_table():
    values, secrets = _values("dev", **{"park:kuberay": {"install": "helm", "version": "1.2.2"}})
    with pytest.raises(ConfigError) as refused:
        from_values(values, "dev", secrets)
    (problem,) = refused.value.problems
    assert (problem.key, problem.value) == ("park:kuberay.version", "1.2.2")
    assert "a chart release ≥ 1.3.0" in problem.message
    values, secrets = _values("dev", **{"park:kuberay": {"install": "helm", "version": "v0.6.0"}})
    with pytest.raises(ConfigError, match=r"chart release ≥ 1\.0\.0"):
        from_values(values, "dev", secrets)


# ---- what the add-on is taken to run ---------------------------------------------------------


def test_the_add_ons_kuberay_never_falls_with_the_gke_version_nor_below_what_is_known():
    key = kuberay.version_key
    floors = [gke.addon_kuberay(gke.GkeVersion(1, m)).version for m in range(28, 40)]
    assert all(key(a) <= key(b) for a, b in itertools.pairwise(floors))
    assert min(floors, key=key) == "1.1.0"  # numOfHosts: multi-host TPU groups on the add-on
    for minor, released in gke._data()["ray_addon"]["kubernetes_released"].items():
        taken = gke.addon_kuberay(gke.parse(f"1.{int(str(minor).split('.')[1]) + 1}"))
        assert kuberay.releases()[taken.version] < released or taken.version == "1.1.0"


@pytest.mark.parametrize("channel", ["RAPID", "REGULAR", "STABLE", "EXTENDED"])
def test_every_channels_default_runs_the_shipped_fields(channel):
    """The channels' defaults as read in infra/data/gke.yaml take every field we emit."""
    taken = gke.addon_kuberay(gke.channel(channel).default).version
    needed = max(
        (
            f.since
            for s in SHIPPED_STACKS
            for m in _ray_objects(render_stack(s))
            for f in kuberay.new_fields(m)
        ),
        key=kuberay.version_key,
    )
    assert kuberay.version_key(taken) >= kuberay.version_key(needed)


def test_the_data_says_google_publishes_none():
    text = (ROOT / "infra" / "data" / "gke.yaml").read_text()
    assert "Google publishes no KubeRay version for the add-on" in text
    assert Path(kuberay.DATA).is_file()
