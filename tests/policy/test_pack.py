"""The pack as Pulumi runs it: PulumiPolicy.yaml, per-stack levels, and the analyzer server
started from policy/__main__.py, answered over gRPC like the engine asks it."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pydantic import ValidationError

from infra.schema.errors import ConfigError
from infra.schema.models import POLICY_RULE_NAMES, PolicyConfig
from policy.harness import urn
from policy.rules import RULES, settings_for_stack, settings_from
from tests.conftest import ROOT
from tests.policy.helpers import first, resources, run

PACK = ROOT / "policy"


def test_project_file_declares_a_python_pack():
    project = yaml.safe_load((PACK / "PulumiPolicy.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    assert (PACK / "__main__.py").is_file()
    requirements = (PACK / "requirements.txt").read_text()
    assert "pulumi-policy==1.21.0" in requirements


def test_rule_names_are_the_config_schema():
    assert tuple(r.name for r in RULES) == POLICY_RULE_NAMES
    assert len({r.name for r in RULES}) == len(RULES)
    assert {r.level for r in RULES} == {"mandatory", "advisory"}


def test_levels_come_from_the_stack_file(tmp_path: Path):
    stack = tmp_path / "Pulumi.staging.yaml"
    stack.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "park:policy": {
                        "enforcement": {"pod-hardening": "mandatory", "tpu-pool-shape": "advisory"},
                        "prodLike": True,
                    }
                }
            }
        )
    )
    settings = settings_for_stack("staging", tmp_path)
    assert settings.levels["pod-hardening"] == "mandatory"
    assert settings.levels["tpu-pool-shape"] == "advisory"
    assert settings.levels["rayjob-shutdown-after-finish"] == "mandatory"
    assert settings.prod_like is True
    assert settings_for_stack("absent", tmp_path).prod_like is False


def test_unknown_rule_name_is_rejected():
    with pytest.raises(ValidationError, match="enforcement"):
        PolicyConfig.model_validate({"enforcement": {"tpu-pool-shap": "advisory"}})


def test_a_disabled_rule_stays_silent_and_advisory_is_reported_as_such():
    records = resources("dev")
    first(records, "kubernetes:ray.io/v1:RayJob")["spec"]["shutdownAfterJobFinishes"] = False
    policy = PolicyConfig(enforcement={"rayjob-shutdown-after-finish": "disabled"})
    assert run(records, "dev", settings_from(policy, "dev")) == []
    policy = PolicyConfig(enforcement={"rayjob-shutdown-after-finish": "advisory"})
    (violation,) = run(records, "dev", settings_from(policy, "dev"))
    assert violation.level == "advisory"


def test_prod_like_follows_the_stack_setting():
    records = resources("dev")
    first(records, "gcp:container/cluster:Cluster")["deletionProtection"] = False
    assert run(records, "dev") == []  # dev may be torn down
    prod_like = settings_from(PolicyConfig(prod_like=True), "dev")
    violations = run(records, "dev", prod_like)
    assert {v.rule for v in violations} == {"deletion-protection-prod"}
    assert {v.resource for v in violations} == {"gke", "storage-bucket"}  # dev force-destroys


def _struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)  # numbers become floats, as on the engine's wire
    return out


@pytest.fixture(scope="module")
def analyzer():
    """policy/__main__.py started as the Pulumi engine starts it (PULUMI_STACK=prod)."""
    env = {**os.environ, "PULUMI_STACK": "prod", "PULUMI_PROJECT": "park-gke"}
    process = subprocess.Popen(
        [sys.executable, "-u", str(PACK)],
        cwd=PACK,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        port = lines.get(timeout=120).strip()
    except queue.Empty:
        process.kill()
        pytest.fail("the policy pack did not print its port within 120 s")
    if not port.isdigit():
        process.kill()
        pytest.fail(f"the policy pack failed to start: {process.stderr.read()}")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield analyzer_pb2_grpc.AnalyzerStub(channel)
    channel.close()
    process.terminate()
    process.wait(timeout=30)


def test_pack_serves_every_rule_at_its_level(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=60)
    assert info.name == "park-gke"
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert set(levels) == set(POLICY_RULE_NAMES)
    for rule in RULES:
        expected = analyzer_pb2.MANDATORY if rule.level == "mandatory" else analyzer_pb2.ADVISORY
        assert levels[rule.name] == expected, rule.name


def test_pack_analyzes_a_resource_like_the_engine(analyzer):
    job = next(r for r in resources("prod") if r["type"] == "kubernetes:ray.io/v1:RayJob")
    job["inputs"]["spec"]["shutdownAfterJobFinishes"] = False
    request = analyzer_pb2.AnalyzeRequest(
        type=job["type"],
        name=job["name"],
        urn=urn("prod", job["type"], job["name"]),
        properties=_struct(json.loads(json.dumps(job["inputs"]))),
    )
    response = analyzer.Analyze(request, timeout=60)
    fired = {d.policyName for d in response.diagnostics}
    assert fired == {"rayjob-shutdown-after-finish"}


def test_pack_analyzes_the_prod_stack_clean(analyzer):
    records = resources("prod")
    request = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(
                type=r["type"],
                name=r["name"],
                urn=urn("prod", r["type"], r["name"]),
                properties=_struct(r["inputs"]),
            )
            for r in records
        ]
    )
    response = analyzer.AnalyzeStack(request, timeout=60)
    assert [d.message for d in response.diagnostics] == []


def test_config_error_names_the_policy_key():
    from infra.stack import from_values

    values = {
        "gcp:project": "p",
        "gcp:region": "us-east5",
        "park:zone": "us-east5-b",
        "park:policy": {"enforcement": {"no-such-rule": "advisory"}},
    }
    with pytest.raises(ConfigError) as err:
        from_values(values, "dev")
    assert any(p.key.startswith("park:policy.enforcement") for p in err.value.problems)
