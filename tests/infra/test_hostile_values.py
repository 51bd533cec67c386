"""Every string is a value, every count is bounded (issue 30, items 2, 4, 5, 9): the grammars
park checks against held to their owners' own validators (huggingface_hub, datasets, the
Kubernetes and Cloud Storage rules as documented), provider credentials that pass and stay
secret, numbers with bounds and a largest stack that validates, renders and prices in
bounded time, and the earlier classes refused under their own key."""

from __future__ import annotations

import copy
import json
import math
import re
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from infra.rules import grammar
from infra.schema.errors import ConfigError
from infra.schema.models import MAX_TPU_POOLS, MAX_TPU_SLICES
from infra.schema.read import read_esc_config
from infra.stack import from_file, from_values
from infra.tools.cli import app
from tests.conftest import STACKS_DIR
from tests.infra.stack_problems import problems_of
from tests.infra.test_hostile_config import with_

# ---- grammars against their owners ------------------------------------------------------------

REPO_CHARS = string.ascii_letters + string.digits + "-_.é/ $"


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet=REPO_CHARS, min_size=1, max_size=24))
def test_hub_ids_are_what_huggingface_hub_accepts(value):
    """Our rule and huggingface_hub's validate_repo_id agree on every string."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
        theirs = True
    except HFValidationError:
        theirs = False
    assert (grammar.hf_repo_problem(value) is None) == theirs, value


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "_.:[]%-+ é", max_size=16))
def test_split_names_are_ones_datasets_accepts(value):
    """Every split we accept is a split name of `datasets` (its NamedSplit rule)."""
    from datasets.splits import NamedSplit

    if grammar.split_problem(value) is None:
        NamedSplit(value)  # raises ValueError for a name datasets refuses
    elif value.isascii() and re.fullmatch(r"\w+(\.\w+)*", value):
        pytest.fail(f"refused a split datasets takes: {value!r}")


# k8s.io/apimachinery/pkg/util/validation/validation.go, as documented there.
K8S = {
    "label": (r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", 63, grammar.dns1123_label_problem),
    "subdomain": (
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
        253,
        grammar.dns1123_subdomain_problem,
    ),
    "dns1035": (r"[a-z]([-a-z0-9]*[a-z0-9])?", 63, grammar.dns1035_label_problem),
}


@pytest.mark.parametrize("kind", sorted(K8S))
@settings(max_examples=300, deadline=None)
@given(value=st.text(alphabet="abZ09-._ é", min_size=1, max_size=70))
def test_kubernetes_names_follow_kubernetes_own_rules(kind, value):
    pattern, limit, ours = K8S[kind]
    theirs = len(value) <= limit and re.fullmatch(pattern, value) is not None
    assert (ours(value) is None) == theirs, value


@pytest.mark.parametrize(
    ("bucket", "ok"),
    [  # cloud.google.com/storage/docs/buckets#naming: its examples and rules
        ("my-travel-maps", True),
        ("0f75d593-8e7b-4418-a5ba-cb2970f0b91e", True),
        ("test.example.com", True),
        ("My-Travel-Maps", False),
        ("my_google_bucket", False),
        ("goog-bucket", False),
        ("192.168.5.4", False),
        ("a" * 64, False),
        (".".join(["a" * 63] * 3), True),
        ("ab", False),
        ("bucket-", False),
    ],
)
def test_bucket_names_follow_the_cloud_storage_rules(bucket, ok):
    assert (grammar.bucket_problem(bucket) is None) is ok


# ---- 2 / 9: each hostile name or path refused under its own key --------------------------------

TRAIN = {"enabled": True, "pool": "serve", "model": "Qwen/Qwen2.5-1.5B-Instruct"}


@pytest.mark.parametrize(
    ("path", "bad", "good", "key"),
    [
        (
            "park:tpuPools.0",
            {"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4",
             "capacity": "reservation", "reservation": "x; rm -rf /"},
            {"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4",
             "capacity": "reservation", "reservation": "projects/p-123456/reservations/v6e"},
            "park:tpuPools[0].reservation",
        ),
        ("park:network", {"podsRangeName": "Pods!"}, {"podsRangeName": "pods-2"},
         "park:network.podsRangeName"),
        ("park:serving.models.0.name", "m\"; x", "org/model-1.5b:v2",
         "park:serving.models[0].name"),
        ("park:cpuPool", {"machineType": "e2 standard"}, {"machineType": "n2-custom-8-16384"},
         "park:cpuPool.machineType"),
        ("park:training", {**TRAIN, "data": "/data/../etc/x.jsonl"},
         {**TRAIN, "data": "/data/sets/x.jsonl"}, "park:training.data"),
        ("park:training", {**TRAIN, "data": "/etc/x.jsonl"},
         {**TRAIN, "data": "gs://my-bucket/x.jsonl"}, "park:training.data"),
        ("park:training", {**TRAIN, "data": "gs://my-bucket/a/../../x.jsonl"},
         {**TRAIN, "data": "gs://my-bucket/a/x.jsonl"}, "park:training.data"),
        ("park:training", {**TRAIN, "model": "Qwen/Qwen2.5--1.5B"},
         {**TRAIN, "model": "Qwen/Qwen2.5-1.5B"}, "park:training.model"),
        ("park:training", {**TRAIN, "dataSplit": "train[:5]"}, {**TRAIN, "dataSplit": "train"},
         "park:training.dataSplit"),
        ("park:storage", {"mountPath": "/var/run/secrets"}, {"mountPath": "/mnt/bucket"},
         "park:storage.mountPath"),
        ("park:storage", {"mountPath": "/var/run/secrets/huggingface/x"},
         {"mountPath": "/data"}, "park:storage.mountPath"),
        ("park:storage", {"mountPath": "/data/../tmp"}, {"mountPath": "/data"},
         "park:storage.mountPath"),
        ("park:serving.image", "evil image:latest", "us-east5-docker.pkg.dev/p/r/img:1.0",
         "park:serving.image"),
    ],
)  # fmt: skip
def test_each_hostile_name_or_path_is_refused_under_its_own_key(path, bad, good, key):
    assert key in problems_of(with_(path, bad))
    assert key not in keys_of(with_(path, good))


def keys_of(values: dict, stack: str = "dev") -> set[str]:
    """The keys of a stack's problems; none when it is valid."""
    try:
        from_values(values, stack)
    except ConfigError as err:
        return {p.key for p in err.problems}
    return set()


def test_two_halves_of_the_internet_are_the_whole_internet():
    halves = {"masterAuthorizedNetworks": [{"cidr": "0.0.0.0/1"}, {"cidr": "128.0.0.0/1"}]}
    for stack in ("prod", "dev"):  # like 0.0.0.0/0, on every stack
        assert "park:cluster.masterAuthorizedNetworks" in problems_of(
            with_("park:cluster", halves), stack
        )
    office = {"masterAuthorizedNetworks": [{"cidr": "203.0.113.0/24"}, {"cidr": "10.0.0.0/8"}]}
    from_values(with_("park:cluster", office), "prod")


def test_the_policy_pack_judges_the_union_too():
    """The rendered cluster with two /1 ranges: the policy pack refuses it as park validate
    does, on a dev stack too."""
    pytest.importorskip("pulumi_policy")
    from infra.schema.models import ClusterConfig, PolicyConfig
    from infra.tools.render import run_program
    from policy.harness import evaluate
    from policy.rules import settings_from

    office = {"masterAuthorizedNetworks": [{"cidr": "203.0.113.0/24"}]}
    records = [r.as_json() for r in run_program(with_("park:cluster", office), "dev").resources]
    (cluster,) = [r for r in records if r["type"] == "gcp:container/cluster:Cluster"]
    blocks = cluster["inputs"]["masterAuthorizedNetworksConfig"]["cidrBlocks"]
    settings_ = settings_from(PolicyConfig(), "dev", ClusterConfig(deletionProtection=False))

    def refused() -> list:
        found = evaluate(records, "dev", settings_)
        return [v for v in found if v.rule == "gke-private-nodes" and "everyone" in v.message]

    assert not refused()
    blocks[:] = [{"cidrBlock": "0.0.0.0/1"}, {"cidrBlock": "128.0.0.0/1"}]
    assert refused()


def test_a_production_stack_turning_policy_rules_off_is_warned():
    private = with_("park:cluster", {"masterAuthorizedNetworks": [{"cidr": "203.0.113.0/24"}]})
    off = with_("park:policy", {"enforcement": {"pod-hardening": "disabled"}}, private)
    keys = {w.key for w in from_values(off, "prod").warnings}
    assert "park:policy.enforcement.pod-hardening" in keys
    keys = {w.key for w in from_values(off, "dev").warnings}
    assert "park:policy.enforcement.pod-hardening" not in keys


def test_names_from_the_stack_reach_a_terminal_escaped(tmp_path):
    folder = tmp_path / "bad\x1b[31mdir"
    folder.mkdir()
    stack = folder / "Pulumi.x.yaml"
    stack.write_text((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    runner = CliRunner()
    for name in ("dev\x1b[2J\u202e", "dev"):
        result = runner.invoke(
            app, ["validate", name, "--config-file", str(stack), "--no-serve-check"]
        )
        assert "\x1b" not in result.output and "\u202e" not in result.output
        assert "Traceback" not in result.output
    result = runner.invoke(app, ["cost", "no\x1b[2Jsuch"])
    assert result.exit_code == 2 and "\x1b" not in result.output


# ---- 4: provider credentials --------------------------------------------------------------------

ACCESS_TOKEN = "ya29." + "a0AfB_byC9xLq2Zt7Wm4Rk8Vn1Hs6Jd3Qz"
HF = "hf_" + "Kq3Zr8Lw" * 5


def _esc_stack(tmp_path: Path) -> Path:
    """README's ESC pattern: the stack file imports park-gke/prod, which sets gcp:project,
    gcp:accessToken (from gcp-login) and park:hfToken."""
    config = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    config.pop("gcp:project")
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump({"environment": ["park-gke/prod"], "config": config}))
    return path


@pytest.mark.parametrize("form", ["esc env open", "pulumi config --json"])
def test_readmes_esc_pattern_passes_and_the_token_stays_secret(tmp_path, form):
    opened = tmp_path / "config.json"
    if form == "esc env open":
        values = {"gcp:project": "my-gcp-project", "gcp:accessToken": ACCESS_TOKEN,
                  "park:hfToken": HF}  # fmt: skip
        opened.write_text(json.dumps({"pulumiConfig": values}))
    else:
        opened.write_text(
            json.dumps(
                {
                    "gcp:project": {"value": "my-gcp-project", "secret": False},
                    "gcp:accessToken": {"value": ACCESS_TOKEN, "secret": True},
                    "park:hfToken": {"value": HF, "secret": True},
                }
            )
        )
    assert "gcp:accessToken" in read_esc_config(opened)[1]  # kept secret
    stack = _esc_stack(tmp_path)
    from_file(stack, "prod", opened)
    runner = CliRunner()
    out = tmp_path / "out"
    for args in (
        ["validate", "prod", "--no-serve-check"],
        ["render", "prod", "--out", str(out)],
        ["cost", "prod"],
    ):
        result = runner.invoke(
            app, [*args, "--config-file", str(stack), "--esc-config", str(opened)]
        )
        assert result.exit_code == 0, result.output
        assert ACCESS_TOKEN[5:20] not in result.output and HF[3:20] not in result.output
    written = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert ACCESS_TOKEN[5:20] not in written and HF[3:20] not in written


def test_a_provider_credential_in_plain_text_is_warned_never_refused_nor_shown():
    values = {**with_("park:zone", "us-east5-b"), "gcp:accessToken": ACCESS_TOKEN}
    plan = from_values(values, "dev", secret_keys=[])
    (warning,) = [w for w in plan.warnings if w.key == "gcp:accessToken"]
    assert ACCESS_TOKEN[5:20] not in str(warning)
    assert not [w for w in from_values(values, "dev", ["gcp:accessToken"]).warnings
                if w.key == "gcp:accessToken"]  # fmt: skip
    # park's own keys are still judged by park's rules
    with pytest.raises(ConfigError):
        from_values({**values, "park:prices": {"source": ACCESS_TOKEN}}, "dev", [])


# ---- 5: bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "bad", "key"),
    [
        ("park:training", {**TRAIN, "learningRate": math.inf}, "park:training.learningRate"),
        ("park:training", {**TRAIN, "learningRate": math.nan}, "park:training.learningRate"),
        ("park:training", {**TRAIN, "estimatedStepSeconds": math.inf},
         "park:training.estimatedStepSeconds"),
        ("park:training", {**TRAIN, "steps": 10**15}, "park:training.steps"),
        ("park:training", {**TRAIN, "globalBatchSize": 10**12}, "park:training.globalBatchSize"),
        ("park:training", {**TRAIN, "seqLen": 10**9}, "park:training.seqLen"),
        ("park:training", {**TRAIN, "activeDeadlineSeconds": 10**12},
         "park:training.activeDeadlineSeconds"),
        ("park:training", {**TRAIN, "ttlSecondsAfterFinished": 10**12},
         "park:training.ttlSecondsAfterFinished"),
        ("park:prices", {"clusterHour": math.inf}, "park:prices.clusterHour"),
        ("park:prices", {"machineHour": {"e2-standard-8": 1e300}},
         "park:prices.machineHour.e2-standard-8"),
        ("park:cpuPool", {"diskSizeGb": 10**9}, "park:cpuPool.diskSizeGb"),
        ("park:tpuPools.0.diskSizeGb", 10**9, "park:tpuPools[0].diskSizeGb"),
        ("park:serving.models.0.maxReplicas", 10**9, "park:serving.models[0].maxReplicas"),
    ],
)  # fmt: skip
def test_numbers_past_their_bounds_are_refused(path, bad, key):
    assert key in problems_of(with_(path, bad))


def _largest() -> dict:
    """The largest stack park accepts: every list at its maximum, the slices at theirs, every
    number at its bound where it drives work."""
    pools = [
        {"name": f"p{i}", "machineType": "ct6e-standard-1t", "topology": "1x1", "slices": 1}
        for i in range(MAX_TPU_POOLS)
    ]
    pools[0] = {"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4",
                "slices": 16}  # fmt: skip
    pools[1] = {**pools[1], "slices": MAX_TPU_SLICES - 16 - (MAX_TPU_POOLS - 2)}
    pools[2] = {"name": "train", "machineType": "ct6e-standard-8t", "topology": "2x4"}
    models = [
        {"name": f"m{i}", "source": "Qwen/Qwen2.5-1.5B-Instruct", "tensorParallelSize": 4}
        for i in range(16)
    ]
    return {
        "gcp:project": "my-project-1",
        "gcp:region": "us-east5",
        "park:zone": "us-east5-b",
        "park:cluster": {
            "masterAuthorizedNetworks": [{"cidr": f"203.0.{i}.0/24"} for i in range(100)]
        },
        "park:tpuPools": pools,
        "park:gpuPools": [
            {
                "name": f"g{i}",
                "machineType": "g2-standard-4",
                "acceleratorType": "nvidia-l4",
                "acceleratorCount": 1,
                "nodes": 900,  # with the TPU hosts: under GKE's 15,000 nodes
            }
            for i in range(16)
        ],
        "park:training": {
            "enabled": True,
            "pool": "train",
            "model": "Qwen/Qwen2.5-1.5B-Instruct",
            "steps": 10_000_000,
            "globalBatchSize": 1 << 20,
            "seqLen": 2048,
            "activationCheckpointing": True,
            "estimatedStepSeconds": 86_400,
        },
        "park:serving": {"enabled": True, "pool": "serve", "models": models},
    }


@pytest.mark.e2e  # three CLI commands over the largest stack: ~10 s
@pytest.mark.timeout(600)
def test_the_largest_accepted_stack_validates_renders_and_prices_in_bounded_time(tmp_path):
    """Not a speed target (benchmarks/ has those): it ends, and one more of anything is
    refused with the stated maximum."""
    values = _largest()
    plan = from_values(values, "dev")
    assert sum(p.slices for p in plan.tpu_pools) == MAX_TPU_SLICES
    stack = tmp_path / "Pulumi.big.yaml"
    stack.write_text(yaml.safe_dump({"config": values}))
    runner = CliRunner()
    for args in (["cost", "big"], ["render", "big"], ["validate", "big", "--no-serve-check"]):
        result = runner.invoke(app, [*args, "--config-file", str(stack)])
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert "Traceback" not in result.output
    more = copy.deepcopy(values)
    more["park:tpuPools"][1]["slices"] += 1
    assert "park:tpuPools" in problems_of(more)
    more = copy.deepcopy(values)
    more["park:tpuPools"].append(
        {"name": "x", "machineType": "ct6e-standard-1t", "topology": "1x1"}
    )
    assert "park:tpuPools" in problems_of(more)


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_an_esc_config_that_never_ends_is_refused_at_once(tmp_path, kind):
    """A FIFO with no writer, /dev/zero or a 10 MB file: refused in one line, never read
    whole (nor waited on)."""
    import os

    from infra.schema.read import StackFileError

    if kind == "fifo":
        given = tmp_path / "config.json"
        os.mkfifo(given)
    elif kind == "device":
        given = Path("/dev/zero")
    else:
        given = tmp_path / "config.json"
        given.write_bytes(b"#" * 10_000_000)
    with pytest.raises(StackFileError) as info:
        from_file(STACKS_DIR / "Pulumi.dev.yaml", "dev", given)
    assert "\n" not in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "changes",
    [{"num_hidden_layers": 10**9}, {"vocab_size": 10**18}, {"hidden_size": 10**12}],
)
def test_a_model_config_anyone_may_write_cannot_make_the_planner_work_for_ever(tmp_path, changes):
    """A config.json from a bucket or a folder is read at preview: sizes past any real model
    are refused under the source's key (the planner walks layers and sizes disks by them)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
        **changes,
    }
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    problems = problems_of(with_("park:serving.models.0.source", str(folder)))
    assert "not a model park can plan" in problems["park:serving.models[0].source"]
