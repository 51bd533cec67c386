"""Every string that reaches a container runs as written (issue 30, item 2).

Hostile values (`$(HOME)`, `$(RAY_DASHBOARD_ADDRESS)`, `$$`, a lone `$`, quotes, `;`) are put
in every stack key that reaches a container's command, args or env, on every shipped stack;
each is either refused naming its key, or rendered so that what the kubelet runs (its `$(VAR)`
expansion, tests/infra/kubelet_rule.py, written from Kubernetes' own rule) and what KubeRay's
submitter hands `ray job submit` are exactly the values the plan means."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.plan import ray
from infra.plan.gates import GATE_MODULE
from infra.plan.kubelet import as_run, literal
from infra.plan.rl import rl_flags
from infra.plan.staging import STAGE_MODULE, staging_jobs
from infra.schema.errors import ConfigError
from infra.stack import from_values
from infra.tools.render import run_program
from tests.conftest import STACKS_DIR
from tests.infra import kubelet_rule
from workloads import protocol
from workloads.rl.config_check import rl_entrypoint
from workloads.train.config_check import training_entrypoint

NASTY = "$(HOME)$$(PYTHONUNBUFFERED)$(RAY_DASHBOARD_ADDRESS)$x$'\";`id`$"
STACKS = ["dev", "prod", "queued", "rl"]


def test_the_rule_is_kubernetes_own():
    """The test's expansion against the cases Kubernetes' expand_test.go documents."""
    env = {"VAR_A": "A", "VAR_B": "B", "VAR_EMPTY": ""}
    cases = {
        "$(VAR_A)": "A",
        "___$(VAR_B)___": "___B___",
        "$(VAR_A)-$(VAR_A)": "A-A",
        "$$(VAR_B)": "$(VAR_B)",
        "$$$$(VAR_A)": "$$(VAR_A)",
        "$$$(VAR_A)": "$A",
        "$(UNKNOWN)": "$(UNKNOWN)",
        "$(VAR_EMPTY)": "",
        "f000-$$VAR_A": "f000-$VAR_A",
        "$(VAR_A": "$(VAR_A",
        "$": "$",
        "$x$": "$x$",
    }
    assert {k: kubelet_rule.expand(k, env) for k in cases} == cases


@given(st.text(alphabet="$()AB_ x", max_size=30))
@settings(max_examples=300, deadline=None)
def test_literal_is_what_the_kubelet_hands_over(value):
    env = {"A": "expanded", "B": ""}
    assert kubelet_rule.expand(literal(value), env) == value
    assert as_run(literal(value)) == value


def _hostile(stack: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The shipped stack with hostile values in the keys that reach a container; {key: value}."""
    values = copy.deepcopy(yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text()))
    config = values["config"]
    planted: dict[str, str] = {}
    training = config.get("park:training")
    if training and training.get("model"):
        for field in ("textField", "messagesField", "promptField", "responseField"):
            planted[f"park:training.{field}"] = training[field] = f"{field}{NASTY}"
        planted["park:training.data"] = training["data"] = (
            f"/data/d/$(HOME)$$x$$/a{NASTY[:8]}.jsonl"
        )
        tokenizer = "gs://my-tokenizers/tok/$(HOME)$$(RAY_JOB_SUBMISSION_ID)"
        planted["park:training.tokenizer"] = training["tokenizer"] = tokenizer
    elif training:
        planted["park:training.data"] = training["data"] = "/data/d/$(HOME)/$$tokens$.bin"
    rl = config.get("park:rl")
    if rl:
        for field in ("promptField", "answerField"):
            planted[f"park:rl.{field}"] = rl[field] = f"{field}{NASTY}"
        planted["park:rl.data"] = rl["data"] = "/data/rl/$(HOME)$$/prompts.jsonl"
    return config, planted


@pytest.mark.parametrize("stack", STACKS)
def test_hostile_values_run_as_written_on_every_shipped_stack(stack):
    config, planted = _hostile(stack)
    try:
        plan = from_values(config, stack)
    except ConfigError as err:  # refused: each problem names a planted key
        keys = {p.key for p in err.problems}
        assert keys and keys <= set(planted), keys
        return
    rendered = run_program(config, stack, plan=plan)
    manifests = rendered.manifests()
    jobs = [m for m in manifests if m["kind"] == "RayJob"]
    assert jobs, "every shipped stack runs a RayJob"
    for job in jobs:
        words = kubelet_rule.submitted_entrypoint(job)
        if job["metadata"]["name"] == "park-rl":
            assert plan.rl is not None
            meant = rl_entrypoint(rl_flags(plan.rl))
        else:
            assert plan.training is not None
            meant = training_entrypoint(ray.trainer_flags(plan.training))
        # what `ray job submit` receives is the plan's own command line, word for word
        assert words == shlex.split(meant)
        for key, value in planted.items():
            flag = protocol.flag(_field(key))
            if key.startswith("park:rl") == (job["metadata"]["name"] == "park-rl"):
                assert words[words.index(flag) + 1] == value, key
        # the runtime env goes inside bash double quotes: nothing there may expand
        _, runtime_env = kubelet_rule.submitter(job)
        assert not set(runtime_env) & set("$`\\"), runtime_env
    mount = plan.spec.storage.mount_path
    for container in _containers(manifests, staging_jobs(plan)):
        env = kubelet_rule.container_env(container)
        if "PARK_BUCKET_MOUNT" in env:
            assert env["PARK_BUCKET_MOUNT"] == mount
            assert env["PARK_BUCKET_URI"] == f"gs://{plan.names.bucket}"
        if container.get("command"):  # the stage Jobs and the readiness gates' Jobs
            run = kubelet_rule.runs(container)
            assert run[:3] in (["python", "-m", STAGE_MODULE], ["python", "-m", GATE_MODULE])
            if run[2] == GATE_MODULE:  # its arguments are the plan's, no stack value
                assert not any(value in " ".join(run) for value in planted.values()), run
                continue
            repo = run[run.index("--repo") + 1]
            assert run[run.index("--dest") + 1] == next(
                s.uri
                for s in plan.disk.staged
                if s.repo == repo  # type: ignore[union-attr]
            )


def _field(key: str) -> str:
    camel = key.rsplit(".", 1)[-1]
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def _containers(manifests: list[dict], jobs: list[dict]) -> list[dict]:
    """Every container of every pod template: Ray heads and workers, submitters, stage Jobs."""
    found = []
    for manifest in [*manifests, *jobs]:
        spec = manifest.get("spec") or {}
        cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig")
        templates = []
        if cluster:
            templates += [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
            templates = [g["template"] for g in templates]
        if spec.get("submitterPodTemplate"):
            templates.append(spec["submitterPodTemplate"])
        if manifest.get("kind") == "Job":
            templates.append(spec["template"])
        found += [c for t in templates for c in t["spec"]["containers"]]
    return found


def test_the_mount_path_and_hub_ids_cannot_carry_an_expansion():
    """Where a grammar exists, `$(` is not in it: refused under the key."""
    base = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())["config"]
    cases = {
        "park:storage.mountPath": ("park:storage", {"mountPath": "/data$(HOME)"}),
        "park:training.model": ("park:training", {**base["park:training"], "model": "a/$(HOME)"}),
        "park:training.tokenizer": (
            "park:training",
            {**base["park:training"], "tokenizer": "Qwen/$(HOME)"},
        ),
    }
    for key, (section, value) in cases.items():
        with pytest.raises(ConfigError) as info:
            from_values({**base, section: value}, "dev")
        assert key in {p.key for p in info.value.problems}
