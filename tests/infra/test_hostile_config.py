"""Hostile and careless stack config (issue 20): where a credential can end up, secretness,
ESC flags, values checked as what they are, posture, and bounded work.

Each class feeds one value that must be refused (the key named, the value never shown) and
one that must pass.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from infra.schema.errors import ConfigError, ConfigProblem
from infra.schema.read import StackFileError, read_esc_config
from infra.stack import from_file, from_values

HF = "hf_" + "Kq3Zr8Lw" * 5
GOOGLE_KEY = "AIza" + "SyD3x9Lw2Qr7Tm5Vn8Bc4Hj6Kp1Zx0Yw" + "a1b"
OAUTH_SECRET = "GOCSPX-" + "4bT9qLmZ2xRw7Kc1NvYs8HdE3pU"
ACCESS_TOKEN = "ya29." + "a0AfB_byC9xLq2Zt7Wm4Rk8Vn1Hs6Jd3"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"

BASE = {
    "gcp:project": "p",
    "gcp:region": "us-east5",
    "park:zone": "us-east5-b",
    "park:tpuPools": [{"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4"}],
    "park:serving": {
        "enabled": True,
        "pool": "serve",
        "models": [{"name": "m", "source": "Qwen/Qwen2.5-1.5B-Instruct", "tensorParallelSize": 4}],
    },
}


def with_(path: str, value: object, base: dict | None = None) -> dict:
    """BASE with `value` at a dotted path ("park:serving.models.0.engineKwargs")."""
    values = copy.deepcopy(base or BASE)
    key, *rest = path.split(".")
    if not rest:
        values[key] = value
        return values
    node = values.setdefault(key, {})
    for part in rest[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[int(rest[-1]) if rest[-1].isdigit() else rest[-1]] = value
    return values


def refused(values: dict, secret_keys: list[str] | None = None) -> dict[str, str]:
    """{key: message} of a refused config; asserts no planted credential is in the error."""
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev", secret_keys)
    text = str(info.value) + "".join(p.shown_value for p in info.value.problems)
    for credential in (HF, GOOGLE_KEY, OAUTH_SECRET, ACCESS_TOKEN, "MIIEvQIBADAN", "s3cr3t"):
        assert credential not in text
    return {p.key: p.message for p in info.value.problems}


# ---- 1. secretness ---------------------------------------------------------------------------


def test_a_key_pulumi_marks_secret_other_than_the_token_is_refused():
    kwargs = with_("park:serving.models.0.engineKwargs", {"max_num_seqs": 8})
    problems = refused(kwargs, secret_keys=["park:serving"])
    assert "cannot stay one" in problems["park:serving"]
    assert from_values(BASE, "dev", ["park:hfToken"]).spec.hf_token is None  # token unset: fine
    token = from_values({**BASE, "park:hfToken": HF}, "dev", ["park:hfToken"])
    assert token.spec.hf_token == "[secret]"


def test_a_secure_value_inside_a_section_of_a_stack_file_is_refused(tmp_path):
    path = tmp_path / "Pulumi.s.yaml"
    text = (
        "config:\n  gcp:project: p\n  gcp:region: us-east5\n  park:zone: us-east5-b\n"
        "  park:tpuPools:\n  - {name: serve, machineType: ct6e-standard-8t, topology: 2x4}\n"
        "  park:serving:\n    enabled: true\n    pool: serve\n    models:\n"
        "    - name: m\n      source: Qwen/Qwen2.5-1.5B-Instruct\n      tensorParallelSize: 4\n"
        "      engineKwargs:\n"
        "        hf_token:\n          secure: v1:abc\n"
    )
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        from_file(path)
    assert "park:serving" in {p.key for p in info.value.problems}
    path.write_text(
        text.replace("      engineKwargs:\n        hf_token:\n          secure: v1:abc\n", "")
        + "  park:hfToken:\n    secure: v1:abc\n"
    )
    assert from_file(path).spec.hf_token == "[secret]"


def test_the_program_refuses_a_secret_it_would_render_in_clear():
    """Under the Pulumi runtime (mocks): is_config_secret marks park:serving; the program
    registers nothing."""
    from infra.tools.render import ProgramError, run_program

    values = with_("park:serving.models.0.engineKwargs", {"max_num_seqs": 8})
    with pytest.raises(ProgramError) as info:
        run_program(values, "dev", ["park:serving"], prevalidate=False)
    assert "park:serving" in str(info.value) and info.value.resources == []


# ---- 2. one credential detector over every config string -------------------------------------

CREDENTIALS = [
    ("park:serving.models.0.engineKwargs", {"hf_token": "abc123"}, "engineKwargs.hf_token"),
    ("park:serving.models.0.engineKwargs", {"tokenizer": HF}, "engineKwargs.tokenizer"),
    ("park:serving.models.0.source", "https://me:s3cr3t@models.example.com/m", "source"),
    ("park:serving.models.0.source", f"https://{HF}@huggingface.co/org/m", "source"),
    ("park:training.data", "gs://b/d.jsonl?X-Goog-Signature=abc&x=1", "training.data"),
    ("park:training.data", "https://example.com/d.jsonl?token=s3cr3t", "training.data"),
    ("park:prices.source", f"https://prices.example.com/?key={GOOGLE_KEY}", "prices.source"),
    ("park:observability.iapOauthSecret", OAUTH_SECRET, "iapOauthSecret"),
    ("park:observability.iapMembers", [f"user:{ACCESS_TOKEN}"], "iapMembers[0]"),
    ("park:storage.bucket", PEM, "storage.bucket"),
    ("park:training.model", json.dumps({"private_key": PEM}), "training.model"),
    ("park:namespace", GOOGLE_KEY, "park:namespace"),
]


@pytest.mark.parametrize(("path", "value", "named"), CREDENTIALS)
def test_a_credential_outside_the_token_key_is_refused_naming_the_key(path, value, named):
    problems = refused(with_(path, value))
    (key,) = [k for k, m in problems.items() if "credential outside park:hfToken" in m]
    assert key.endswith(named)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("park:serving.models.0.engineKwargs", {"tokenizer": "Qwen/Qwen2.5-1.5B-Instruct"}),
        ("park:serving.models.0.engineKwargs", {"max_num_batched_tokens": 8192}),
        ("park:prices.source", "https://cloud.google.com/tpu/pricing?hl=en"),
        ("park:serving.models.0.source", "gs://my-bucket/models/qwen"),
    ],
)
def test_values_that_only_resemble_credentials_pass(path, value):
    from_values(with_(path, value), "dev")


def test_messages_never_quote_a_credential_even_where_the_value_is_masked():
    problem = ConfigProblem("park:x", "fine", f"cannot use {HF} or https://a:s3cr3t@h/x")
    assert HF not in str(problem) and "s3cr3t" not in str(problem)
    assert "cannot use" in str(problem)


# ---- 4. ESC as Pulumi reads it -----------------------------------------------------------------


def _cli_json(tmp_path: Path, secret: bool) -> Path:
    path = tmp_path / "config.json"
    entries = {
        "gcp:project": {"value": "p", "secret": False},
        "park:hfToken": {"value": HF, "secret": secret},
    }
    path.write_text(json.dumps(entries))
    return path


def _stack_file(tmp_path: Path) -> Path:
    path = tmp_path / "Pulumi.esc.yaml"
    path.write_text(
        "environment: [park/prod]\nconfig:\n  gcp:region: us-east5\n  park:zone: us-east5-b\n"
    )
    return path


def test_a_credential_key_pulumi_holds_in_plain_text_is_refused(tmp_path):
    with pytest.raises(ConfigError) as info:
        from_file(_stack_file(tmp_path), esc_config=_cli_json(tmp_path, secret=False))
    assert "park:hfToken" in {p.key for p in info.value.problems}
    assert HF not in str(info.value)
    plan = from_file(_stack_file(tmp_path), esc_config=_cli_json(tmp_path, secret=True))
    assert plan.spec.hf_token == "[secret]"


def test_an_unopened_fn_secret_is_not_a_value(tmp_path):
    definition = tmp_path / "env.yaml"
    definition.write_text(
        "values:\n  pulumiConfig:\n    gcp:project: p\n"
        "    park:hfToken:\n      fn::secret:\n        ciphertext: ZXNjeAAAAAEAAAEA\n"
    )
    with pytest.raises(StackFileError, match="fn::"):
        read_esc_config(definition)
    opened = tmp_path / "opened.json"
    opened.write_text(json.dumps({"pulumiConfig": {"gcp:project": "p", "park:hfToken": HF}}))
    assert read_esc_config(opened)[1] == ["park:hfToken"]


# ---- 6. bounded YAML ---------------------------------------------------------------------------


def _alias_bomb() -> str:
    lines = ["config:", "  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_alias_bomb(), "alias bomb"),
        ("config:\n  park:x: " + "[" * 50_000 + "]" * 50_000 + "\n", "deeper than"),
        (
            "config:\n"
            + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(500))
            + "  " * 501
            + "v\n",
            "deeper than",
        ),
    ],
)
def test_the_yaml_reader_refuses_alias_bombs_and_deep_nesting_within_a_second(tmp_path, text, why):
    assert len(text) < 1_100_000
    path = tmp_path / "Pulumi.bomb.yaml"
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(StackFileError, match=why) as info:
        from_file(path)
    assert time.perf_counter() - started < 1.0
    assert "\n" not in str(info.value)


def test_a_stack_file_with_ordinary_aliases_still_reads(tmp_path):
    path = tmp_path / "Pulumi.alias.yaml"
    pool = "{name: serve, machineType: ct6e-standard-8t, topology: 2x4}"
    path.write_text(
        f"config:\n  gcp:project: p\n  gcp:region: us-east5\n  park:zone: us-east5-b\n"
        f"  park:tpuPools:\n  - &pool {pool}\n  park:cpuPool: {{maxNodes: 4}}\n"
    )
    assert from_file(path).spec.tpu_pools[0].name == "serve"


def test_a_remote_model_lookup_is_bounded_in_time(monkeypatch):
    """A gs:// lookup that never answers (pyarrow's client retries for ~15 minutes) ends in
    a one-line FactsError after PARK_REMOTE_TIMEOUT_S; a bare gs:// is one line at once."""
    import threading

    from infra import model_facts, model_lookup

    released = threading.Event()

    def hangs(uri: str):
        released.wait(30)  # the network that never answers; released at the end of the test
        raise AssertionError("not reached in time")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("PARK_OFFLINE", raising=False)
    monkeypatch.setattr(model_lookup, "REMOTE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(model_lookup, "_from_uri", hangs)
    started = time.perf_counter()
    try:
        with pytest.raises(model_facts.FactsError, match="no answer in") as info:
            model_lookup.from_uri("gs://my-bucket/models/x")
        assert time.perf_counter() - started < 2.0 and "\n" not in str(info.value)
    finally:
        released.set()
    with pytest.raises(model_facts.FactsError, match="not a bucket path"):
        model_lookup.from_uri("gs://")
