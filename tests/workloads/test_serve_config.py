"""The serve config without a server: CPU profile, validation with Ray's classes, tiny model."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workloads.serve_fixtures import rendered_serve_configs, tpu_serve_config
from workloads.serve.cpu_profile import CPU_ENGINE_KWARGS, CPU_MAX_MODEL_LEN, to_cpu
from workloads.serve.validate import validate_serve_config

MODEL = "/models/tiny"


def _llm(config: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return config["applications"][0]["args"]["llm_configs"][i]


# --- cpu_profile ---------------------------------------------------------------------------


def test_to_cpu_of_the_contract_config_is_exactly_this() -> None:
    cpu, changes = to_cpu(tpu_serve_config(), MODEL)
    assert cpu == {
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {
                    "llm_configs": [
                        {
                            "model_loading_config": {
                                "model_id": "llama-3.1-8b-instruct",
                                "model_source": MODEL,
                            },
                            "accelerator_config": {"kind": "cpu"},
                            "engine_kwargs": {
                                "max_model_len": CPU_MAX_MODEL_LEN,
                                **CPU_ENGINE_KWARGS,
                            },
                            "deployment_config": {
                                "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}
                            },
                            "runtime_env": {
                                "env_vars": {
                                    "TPU_MULTIHOST_BACKEND": "ray",
                                    "VLLM_DISABLE_COMPILE_CACHE": "1",
                                }
                            },
                        }
                    ],
                    "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}},
                },
            }
        ]
    }
    text = "\n".join(changes)
    for word in (
        "accelerator_type 'TPU-V6E'",
        "{'kind': 'cpu'}",
        "model_source 'gs://b/models/x'",
        "tensor_parallel_size=16",
        "enable_expert_parallel",
        "max_model_len 8192 -> 2048",
        "dtype",
        "enforce_eager",
        "kv_cache_memory_bytes",
        "num_cpus",
    ):
        assert word in text, f"{word!r} not reported in:\n{text}"
    assert len(changes) == 10


def test_to_cpu_does_not_mutate_its_input_and_is_idempotent() -> None:
    tpu = tpu_serve_config()
    before = copy.deepcopy(tpu)
    cpu, _ = to_cpu(tpu, MODEL)
    assert tpu == before
    again, changes = to_cpu(cpu, MODEL)
    assert again == cpu
    assert changes == []


def test_to_cpu_caps_replicas_drops_accelerator_resources_and_unselected_models() -> None:
    tpu = tpu_serve_config()
    second = copy.deepcopy(_llm(tpu))
    second["model_loading_config"]["model_id"] = "other"
    _llm(tpu)["deployment_config"] = {
        "autoscaling_config": {"min_replicas": 2, "max_replicas": 4, "initial_replicas": 3},
        "ray_actor_options": {"resources": {"TPU": 4, "custom": 1}},
    }
    _llm(tpu)["placement_group_config"] = {"bundle_per_worker": {"TPU": 4}}
    tpu["applications"][0]["args"]["llm_configs"].append(second)
    cpu, changes = to_cpu(tpu, MODEL, keep_models=["llama-3.1-8b-instruct"])
    llms = cpu["applications"][0]["args"]["llm_configs"]
    assert [x["model_loading_config"]["model_id"] for x in llms] == ["llama-3.1-8b-instruct"]
    deployment = llms[0]["deployment_config"]
    assert deployment["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 1,
        "initial_replicas": 1,
    }
    assert deployment["ray_actor_options"]["resources"] == {"custom": 1}
    assert "placement_group_config" not in llms[0]
    assert any("dropped model 'other'" in c for c in changes)


def test_to_cpu_leaves_other_apps_alone_and_rejects_configs_without_llm() -> None:
    other = {"name": "web", "route_prefix": "/web", "import_path": "app:web", "args": {"a": 1}}
    tpu = tpu_serve_config()
    tpu["applications"].append(copy.deepcopy(other))
    tpu["http_options"] = {"port": 8000}
    cpu, _ = to_cpu(tpu, MODEL)
    assert cpu["applications"][1] == other
    assert cpu["http_options"] == {"port": 8000}
    with pytest.raises(ValueError, match="llm_configs"):
        to_cpu({"applications": [other]}, MODEL)
    with pytest.raises(ValueError, match="selected"):
        to_cpu(tpu_serve_config(), MODEL, keep_models=["nope"])


# Paths (inside one llm_config) that to_cpu may change; anything else must come out untouched.
KNOBS = (
    ("accelerator_type",),
    ("accelerator_config",),
    ("placement_group_config",),
    ("model_loading_config", "model_source"),
    ("model_loading_config", "tokenizer_source"),
    ("engine_kwargs",),
    ("deployment_config", "autoscaling_config"),
    ("deployment_config", "num_replicas"),
    ("deployment_config", "ray_actor_options", "resources"),
)


def _strip(llm: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(llm)
    for path in KNOBS:
        node: Any = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


_names = st.text("abcdefgh-_", min_size=1, max_size=8)
_values = st.one_of(st.integers(-5, 5), st.booleans(), _names)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra_llm=st.dictionaries(st.sampled_from(["lora_config", "log_engine_metrics"]), _values),
    extra_engine=st.dictionaries(_names, _values, max_size=3),
    deployment=st.fixed_dictionaries(
        {},
        optional={
            "max_ongoing_requests": st.integers(1, 64),
            "num_replicas": st.integers(1, 8),
            "autoscaling_config": st.fixed_dictionaries(
                {"min_replicas": st.integers(0, 4), "max_replicas": st.integers(1, 8)}
            ),
            "health_check_period_s": st.integers(1, 30),
        },
    ),
    env=st.dictionaries(_names, _names, max_size=3),
    app_name=_names,
    route=_names,
)
def test_to_cpu_changes_only_knobs_and_reports_every_change(
    extra_llm: dict[str, Any],
    extra_engine: dict[str, Any],
    deployment: dict[str, Any],
    env: dict[str, str],
    app_name: str,
    route: str,
) -> None:
    tpu = tpu_serve_config()
    tpu["applications"][0].update(name=app_name, route_prefix=f"/{route}")
    llm = _llm(tpu)
    llm.update(extra_llm)
    llm["engine_kwargs"].update(extra_engine)
    llm["deployment_config"] = deployment
    llm["runtime_env"] = {"env_vars": env}
    cpu, changes = to_cpu(tpu, MODEL)

    out = _llm(cpu)
    assert _strip(out) == _strip(llm)  # nothing outside the knobs moved
    assert {k: v for k, v in cpu["applications"][0].items() if k != "args"} == {
        k: v for k, v in tpu["applications"][0].items() if k != "args"
    }
    assert "accelerator_type" not in out
    assert out["accelerator_config"] == {"kind": "cpu"}
    for key, value in CPU_ENGINE_KWARGS.items():
        assert out["engine_kwargs"][key] == value
    for key in ("tensor_parallel_size", "enable_expert_parallel"):
        assert key not in out["engine_kwargs"]
    # Each changed engine knob and replica count is named in the change list.
    text = "\n".join(changes)
    for key in set(llm["engine_kwargs"]) | set(out["engine_kwargs"]):
        if llm["engine_kwargs"].get(key) != out["engine_kwargs"].get(key):
            assert f"engine_kwargs.{key}" in text
    if llm["deployment_config"] != out["deployment_config"]:
        assert "replicas" in text
    assert to_cpu(cpu, MODEL)[1] == []


def test_cpu_config_passes_rays_validation() -> None:
    cpu, _ = to_cpu(tpu_serve_config(), MODEL)
    assert validate_serve_config(cpu) == []


# --- validation with Ray's classes --------------------------------------------------------


def test_contract_tpu_config_is_valid_for_ray_without_tpu_or_ray_running() -> None:
    import ray

    assert validate_serve_config(yaml.safe_dump(tpu_serve_config())) == []
    assert not ray.is_initialized()


def test_tpu_config_resolves_to_one_bundle_of_4_chips_per_v6e_host() -> None:
    """TP 16 on a v6e 4x4 (4 hosts of 4 chips) -> 4 bundles of {"TPU": 4}, as Ray computes."""
    from ray.serve.llm import LLMConfig

    llm = LLMConfig.model_validate(_llm(tpu_serve_config()))
    engine = llm.get_engine_config()
    assert engine is not None
    assert [b["TPU"] for b in engine.placement_bundles] == [4, 4, 4, 4]
    assert engine.accelerator.requires_deferred_placement_group  # slice PG made in the replica
    assert engine.mirror_config is not None  # gs:// source becomes a bucket mirror


@pytest.mark.parametrize("stack", sorted(rendered_serve_configs()))
def test_every_rendered_stack_serve_config_is_valid(stack: str) -> None:
    assert validate_serve_config(rendered_serve_configs()[stack]) == []


def _mutate(fn: Any) -> dict[str, Any]:
    config = tpu_serve_config()
    fn(config, _llm(config))
    return config


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("a: [", "not YAML"),
        ("- 1", "must be a mapping"),
        (_mutate(lambda c, m: m.update(accelerator_type="v6e")), "Unsupported accelerator"),
        (_mutate(lambda c, m: m.pop("accelerator_type")), "accelerator_type must be provided"),
        (_mutate(lambda c, m: m["engine_kwargs"].update(bogus=1)), "Unknown engine argument"),
        (_mutate(lambda c, m: m["engine_kwargs"].update(tensor_parallel_size=6)), "multiple"),
        (_mutate(lambda c, m: m["engine_kwargs"].update(tensor_parallel_size=32)), "has 16"),
        (
            _mutate(
                lambda c, m: m["deployment_config"]["autoscaling_config"].update(min_replicas=3)
            ),
            "deployment_config",
        ),
        (_mutate(lambda c, m: m["engine_kwargs"].update(model="x")), "model"),
        (_mutate(lambda c, m: c["applications"][0].update(route_prefix="v1")), "route_prefix"),
        (
            _mutate(lambda c, m: c["applications"][0]["args"]["llm_configs"].append(m)),
            "Duplicate models",
        ),
        (_mutate(lambda c, m: c["applications"].append(c["applications"][0])), "multiple configs"),
    ],
)
def test_validation_reports_problems(config: str | dict[str, Any], expected: str) -> None:
    problems = validate_serve_config(config)
    assert problems, "expected a problem"
    assert expected in "\n".join(problems)


def test_local_deploy_refuses_an_invalid_config_before_starting_ray(tmp_path: Path) -> None:
    import ray

    from workloads.serve import local

    bad = tpu_serve_config()
    _llm(bad)["engine_kwargs"]["no_such_knob"] = 1
    with pytest.raises(ValueError, match="no_such_knob"):
        local.deploy(bad, model_path=str(tmp_path))
    assert not ray.is_initialized()


def test_load_serve_config_reads_the_rendered_yaml(tmp_path: Path) -> None:
    from workloads.serve import local

    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(tpu_serve_config()))
    config = local.load_serve_config(path)
    assert local.served_models(config) == ["llama-3.1-8b-instruct"]
    path.write_text("- not a mapping")
    with pytest.raises(ValueError, match="mapping"):
        local.load_serve_config(path)


# --- tiny model -----------------------------------------------------------------------------


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_tiny_model_is_deterministic_cached_and_chat_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from workloads.serve.tiny_model import SPEC, build_tiny_model

    monkeypatch.setenv("PARK_CACHE_DIR", str(tmp_path / "cache"))
    first = build_tiny_model()
    assert first == tmp_path / "cache" / "tiny-llama"
    other = build_tiny_model(tmp_path / "again")
    assert _digest(first) == _digest(other)

    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime  # cache hit, no rebuild

    config = AutoConfig.from_pretrained(first)
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.vocab_size == SPEC["vocab_size"]
    tok = AutoTokenizer.from_pretrained(first)
    text = "hello tpu world: 42!"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s><|user|>\nhi</s>\n<|assistant|>\n"
