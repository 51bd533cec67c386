"""`park stage-model` (issue 30, item 3): one Job per hub model, named uniquely (a digest
suffix) and as Kubernetes requires (a DNS-1123 label: the Job controller copies the name into
its pods' `batch.kubernetes.io/job-name` label), and it works, or says there is nothing to
stage, on every shipped stack."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from infra.plan.staging import job_name
from infra.tools.cli import app
from tests.conftest import STACKS_DIR

# k8s.io/apimachinery/pkg/util/validation: IsDNS1123Label, and a label value's length
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

HUB_PART = st.text(alphabet="abcXYZ019-_.é", min_size=1, max_size=60)


@settings(max_examples=500, deadline=None)
@given(HUB_PART, HUB_PART)
def test_a_stage_jobs_name_is_a_dns1123_label_whatever_the_id(org, name):
    made = job_name(f"{org}/{name}")
    assert len(made) <= 63 and DNS1123_LABEL.fullmatch(made), made
    assert made.isascii()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("Org/a.b", "org/a-b"),  # punctuation and case fold to one slug
        ("Org/Model", "org/model"),
        ("org/" + "x" * 70 + "-a", "org/" + "x" * 70 + "-b"),  # the same first 63 characters
        ("org/modèle", "org/mod-le"),  # a non-ASCII letter
    ],
)
def test_two_models_never_share_a_stage_job(one, other):
    assert job_name(one) != job_name(other)
    assert job_name(one) == job_name(one)


@pytest.mark.parametrize("stack", ["dev", "prod", "queued", "rl"])
def test_stage_model_works_on_every_shipped_stack(stack):
    result = CliRunner().invoke(
        app, ["stage-model", stack, "--config-file", str(STACKS_DIR / f"Pulumi.{stack}.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    jobs = [d for d in yaml.safe_load_all(result.stdout) if d]
    if not jobs:
        assert "nothing to stage" in result.output
    names = [j["metadata"]["name"] for j in jobs]
    assert len(set(names)) == len(names)
    for job in jobs:
        assert DNS1123_LABEL.fullmatch(job["metadata"]["name"])
        (container,) = job["spec"]["template"]["spec"]["containers"]
        repo = container["command"][container["command"].index("--repo") + 1]
        assert job["metadata"]["name"] == job_name(repo)
