"""The serve config without a server: CPU profile, validation with Ray's classes, tiny model."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Background
from tests.workloads.serve_fixtures import rendered_serve_configs, tpu_serve_config
from workloads.serve.cpu_profile import CPU_ENGINE_KWARGS, CPU_MAX_MODEL_LEN, to_cpu
from workloads.serve.validate import validate_serve_config

MODEL = "/models/tiny"
# Checked with Ray's LLM classes: ray.serve.llm imports vLLM (~10 s of CPU, once per process).
RAYS_LLM = pytest.mark.serve


@pytest.fixture(autouse=True)
def _no_direct_streaming_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """to_cpu reads RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING by default; these tests pin it off."""
    monkeypatch.delenv("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", raising=False)


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


@RAYS_LLM
def test_to_cpu_keeps_a_rendered_wait_only_for_a_model_being_written() -> None:
    """dev's replica waits for the training run's export (workloads/serve/wait.py). Locally
    the wait stays when the model path is an export still being written (bounded by this run),
    and goes when the model is complete (the tiny stand-in): it would wait for a marker no one
    writes."""
    from tests.conftest import render_stack

    (service,) = [m for m in render_stack("dev").manifests() if m["kind"] == "RayService"]
    dev = yaml.safe_load(service["spec"]["serveConfigV2"])
    rendered = _llm(dev)["callback_config"]
    assert rendered["callback_kwargs"]["timeout_s"] > 1800

    waits, changes = to_cpu(dev, MODEL, wait_s=1800)
    kept = _llm(waits)["callback_config"]
    assert kept["callback_class"] == rendered["callback_class"]
    assert kept["callback_kwargs"] == {**rendered["callback_kwargs"], "timeout_s": 1800}
    assert any("callback_config timeout_s" in c for c in changes)
    assert validate_serve_config(waits) == []

    complete, changes = to_cpu(dev, MODEL)
    assert "callback_config" not in _llm(complete)
    assert any("removed callback_config" in c for c in changes)


@RAYS_LLM
def test_cpu_config_passes_rays_validation() -> None:
    cpu, _ = to_cpu(tpu_serve_config(), MODEL)
    assert validate_serve_config(cpu) == []


# --- validation with Ray's classes --------------------------------------------------------


@RAYS_LLM
def test_contract_tpu_config_is_valid_for_ray_without_tpu_or_ray_running() -> None:
    import ray

    assert validate_serve_config(yaml.safe_dump(tpu_serve_config())) == []
    assert not ray.is_initialized()


@RAYS_LLM
def test_tpu_config_resolves_to_one_bundle_of_4_chips_per_v6e_host() -> None:
    """TP 16 on a v6e 4x4 (4 hosts of 4 chips) -> 4 bundles of {"TPU": 4}, as Ray computes."""
    from ray.serve.llm import LLMConfig

    llm = LLMConfig.model_validate(_llm(tpu_serve_config()))
    engine = llm.get_engine_config()
    assert engine is not None
    assert [b["TPU"] for b in engine.placement_bundles] == [4, 4, 4, 4]
    assert engine.accelerator.requires_deferred_placement_group  # slice PG made in the replica
    assert engine.mirror_config is not None  # gs:// source becomes a bucket mirror


@RAYS_LLM
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
@RAYS_LLM
def test_validation_reports_problems(config: str | dict[str, Any], expected: str) -> None:
    problems = validate_serve_config(config)
    assert problems, "expected a problem"
    assert expected in "\n".join(problems)


@pytest.mark.serve  # checks engine_kwargs against vLLM's own arguments: imports vLLM
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


# --- the shipped Ray Serve tuning (infra/plan/serve_tuning.py) ---------------------------------


def _dev_serve_config() -> dict[str, Any]:
    """The dev stack's serveConfigV2 as the plan renders it today (with serve_tuning's keys)."""
    from infra.plan import ray as ray_plan
    from infra.stack import from_file

    plan = from_file(Path(__file__).resolve().parents[2] / "stacks" / "Pulumi.dev.yaml")
    assert plan.serving is not None
    return ray_plan.serve_config(plan.serving, ray_plan.ray_pods(plan))


@RAYS_LLM
def test_rendered_config_carries_every_shipped_knob_and_passes_rays_validation() -> None:
    from infra.plan import serve_tuning

    config = _dev_serve_config()
    args = config["applications"][0]["args"]
    llm = args["llm_configs"][0]
    for key, value in serve_tuning.llm_config_options().items():
        assert llm[key] == value
    for key, value in serve_tuning.deployment_options().items():
        assert llm["deployment_config"][key] == value
    for key, value in serve_tuning.app_args().items():
        assert args[key] == value
    assert validate_serve_config(config) == []
    for direct in (False, True):
        cpu, _ = to_cpu(config, MODEL, direct_streaming=direct)
        assert validate_serve_config(cpu) == []


@RAYS_LLM
def test_shipped_llm_config_options_are_read_by_rays_llm_server() -> None:
    """LLMConfig keeps the keys (no silent drop); the stream batching interval that serve_tuning
    documents (and leaves alone) is the one Ray's LLMServer uses."""
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig

    from infra.plan import serve_tuning

    llm = LLMConfig.model_validate(_llm(_dev_serve_config()))
    assert llm.log_engine_metrics is True
    server = SimpleNamespace(
        _llm_config=llm
    )  # an LLMServer without an engine (its __del__ is async)
    interval: Any = LLMServer._get_batch_interval_ms
    assert interval(server) == serve_tuning.STREAM_BATCHING_INTERVAL_MS_DEFAULT
    assert interval(server, stream=False) is None


def _ray_source(relative: str) -> str:
    import ray

    return (Path(ray.__file__).parent / relative).read_text()


def test_shipped_env_names_are_rays_own() -> None:
    from infra.plan import serve_tuning

    source = _ray_source("serve/_private/constants.py") + _ray_source(
        "llm/_internal/serve/constants.py"
    )
    for name in serve_tuning.ray_env(num_models=1):
        assert f'"{name}"' in source, f"Ray 2.60 reads no {name}"


def test_direct_streaming_only_for_a_single_model() -> None:
    """Ray 2.60's build_openai_app refuses direct streaming with more than one LLMConfig."""
    from infra.plan import serve_tuning

    assert "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING" in serve_tuning.ray_env(num_models=1)
    assert "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING" not in serve_tuning.ray_env(num_models=2)
    assert serve_tuning.ray_env() == serve_tuning.ray_env(num_models=1)


@pytest.mark.serve
def test_throughput_env_switches_rays_constants(tmp_path: Path) -> None:
    """What the pods' env does, as Ray's own constants module computes it in a fresh process."""
    import json
    import os
    import subprocess
    import sys

    from infra.plan import serve_tuning

    probe = (
        "import json\n"
        "import ray.serve._private.constants as c\n"
        "import ray.llm._internal.serve.constants as l\n"
        "print(json.dumps({k: getattr(c, k, None) for k in ("
        "'RAY_SERVE_ENABLE_DIRECT_INGRESS', 'RAY_SERVE_USE_GRPC_BY_DEFAULT',"
        "'RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD', 'RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP',"
        "'RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE', 'RAY_SERVE_ENABLE_HA_PROXY',"
        "'RAY_SERVE_HAPROXY_BALANCE_ALGORITHM')}"
        " | {'DIRECT_STREAMING': l.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_SERVE", "RAYLLM"))}

    def constants(env: dict[str, str]) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env={**base, **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    shipped = constants(serve_tuning.ray_env(num_models=1))
    assert shipped == {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": True,
        "RAY_SERVE_USE_GRPC_BY_DEFAULT": True,
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": False,
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": False,
        "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": 1000,
        "RAY_SERVE_ENABLE_HA_PROXY": True,
        "RAY_SERVE_HAPROXY_BALANCE_ALGORITHM": "leastconn",
        "DIRECT_STREAMING": True,
    }
    defaults = constants({})
    assert defaults["RAY_SERVE_ENABLE_DIRECT_INGRESS"] is False
    assert defaults["DIRECT_STREAMING"] is False


# One subprocess of Ray's LLM code (its import loads vLLM: ~15 s) for two checks.
# Ray's app builder starts a local Ray in the calling process, and a Ray Train run later in the
# same process (tests/workloads/test_train_ray.py) then loses its controller actor even after a
# ray.shutdown(); so the builder runs in a subprocess of its own.
# Ray 2.60 also registers KV-connector backends at import, in the KV store once Ray is connected,
# and raises if another process (the Serve controller building the app) wrote the name between
# its check and its write: the probe records which import registers, and that once the
# registering module is imported early (before connecting) importing ray.serve.llm registers
# nothing more.
_RAY_LLM_PROBE = """
import json, sys
from ray.llm._internal.serve.utils import registry

calls = []
register = registry.ComponentRegistry.register

def recording(self, name, value):
    calls.append(name)
    return register(self, name, value)

registry.ComponentRegistry.register = recording
from workloads.serve.validate import register_llm_components_before_connecting

register_llm_components_before_connecting()
early = list(calls)
import ray.serve.llm  # what validate_serve_config imports once Ray is connected
from ray.llm._internal.serve.core.ingress import builder

print("REGISTRATIONS " + json.dumps({"early": early, "later": calls[len(early):]}))

import pytest

builder.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING = True
configs = json.load(sys.stdin)
app = builder.build_openai_app(configs["direct"])
assert app._ingress_request_router is not None, "no LLMRouter"  # HAProxy asks it for a replica
assert "LLMServer" in app._bound_deployment.name, app._bound_deployment.name
with pytest.raises(ValueError, match="ingress_deployment_config"):
    builder.build_openai_app(configs["with_ingress"])
print("BUILT")

# Every rendered app (tests/infra/test_serve_render.py), from its own import_path, under its
# pods' env: the two variables the build path reads, set as Ray computes them at import
# (L/constants.py:65-67 into the builder; S/constants.py:752 into S/build_app.py).
from ray._common.utils import import_attr
from ray.serve._private import build_app as serve_build

for item in configs["apps"]:
    env, app = item["env"], item["app"]
    direct = env.get("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", "0") == "1"
    builder.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING = direct
    serve_build.RAY_SERVE_ENABLE_HA_PROXY = env.get("RAY_SERVE_ENABLE_HA_PROXY", "0") == "1"
    row = {"stack": item["stack"], "app": app["name"], "direct_streaming": direct,
           "import_path": app["import_path"], "error": None, "deployments": []}
    try:
        application = import_attr(app["import_path"])(app["args"])
        built = serve_build.build_app(application, name=app["name"])
        row["ingress"] = built.ingress_deployment_name
        row["router"] = application._ingress_request_router is not None
        for d in built.deployments:
            config = d._deployment_config
            scaling = config.autoscaling_config
            row["deployments"].append({
                "name": d.name,
                "health_check_timeout_s": config.health_check_timeout_s,
                "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
                "autoscaling": scaling and {
                    "min_replicas": scaling.min_replicas,
                    "max_replicas": scaling.max_replicas,
                    "target_ongoing_requests": scaling.target_ongoing_requests,
                },
            })
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}"
    print("BUILT_APP " + json.dumps(row), flush=True)

# Our builder (workloads/serve/app.py) on the dev config's CPU args and variants of them, under
# HAProxy, without Ray's direct streaming (tests/workloads/test_serve_app.py reads the rows).
from ray.serve.llm import LLMServingArgs
from workloads.serve import app as ours

builder.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING = False
serve_build.RAY_SERVE_ENABLE_HA_PROXY = True
for name, args in configs["ours"].items():
    row = {"variant": name, "error": None}
    try:
        application = import_attr(ours.IMPORT_PATH)(args)
        built = serve_build.build_app(application, name="llm")
        row.update(
            ingress=built.ingress_deployment_name,
            deployments=sorted(d.name for d in built.deployments),
            router=application._ingress_request_router is not None,
            why=ours.why_rays_ingress(LLMServingArgs.model_validate(args)),
        )
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}"
    print("OUR_BUILDER " + json.dumps(row), flush=True)
"""


@dataclass
class RayLlmProbe:
    """The probe's process, started with its input; ``result`` waits for its stdout."""

    proc: Background
    args: dict[str, Any]

    def result(self) -> tuple[str, dict[str, Any]]:
        return self.proc.output(300), self.args

    def stop(self) -> None:
        self.proc.stop()


def start_ray_llm_probe(config: pytest.Config) -> RayLlmProbe:
    """The probe's process on the dev config's CPU args, under direct streaming and without."""
    from workloads.serve import app as serve_app
    from workloads.serve import validate

    cpu, _ = to_cpu(_dev_serve_config(), MODEL, direct_streaming=True)
    args = cpu["applications"][0]["args"]
    # Ray's own builder's case: its import path, where the CPU profile sizes Ray's ingress
    # (the rendered path is ours, workloads/serve/app.py, whose one-model app has no ingress)
    rays = _dev_serve_config()
    rays["applications"][0]["import_path"] = serve_app.RAYS_IMPORT_PATH
    with_ingress, _ = to_cpu(rays, MODEL, direct_streaming=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = str(Path(validate.__file__).parents[2])
    work = config._tmp_path_factory.mktemp("ray-llm-probe")  # type: ignore[attr-defined]
    from tests.infra.test_serve_render import probe_apps
    from tests.workloads.test_serve_app import builder_variants

    configs = {
        "direct": args,
        "with_ingress": with_ingress["applications"][0]["args"],
        "apps": probe_apps(),
        "ours": builder_variants(args),
    }
    command = [sys.executable, "-c", _RAY_LLM_PROBE]
    probe = Background.start(command, work, env=env, cwd=work, stdin=json.dumps(configs).encode())
    return RayLlmProbe(probe, args)


@pytest.mark.serve
def test_shipped_config_builds_with_rays_builder_under_direct_streaming(
    ray_llm_probe: tuple[str, dict[str, Any]],
) -> None:
    """build_openai_app makes the LLM server the ingress (with its router), and would refuse the
    ingress_deployment_config that the CPU profile leaves out under direct streaming."""
    stdout, args = ray_llm_probe
    assert "ingress_deployment_config" not in args
    assert "BUILT" in stdout
    _, changes = to_cpu(_dev_serve_config(), MODEL, direct_streaming=True)
    assert not any("num_cpus" in c for c in changes)


@pytest.mark.serve
def test_the_early_import_takes_every_registration_ray_serve_llm_makes(
    ray_llm_probe: tuple[str, dict[str, Any]],
) -> None:
    """The serve driver imports the registering module before ray.init, so its ray.serve.llm
    import (after connecting, while the controller imports the same) cannot lose Ray's race."""
    import json

    (line,) = [x for x in ray_llm_probe[0].splitlines() if x.startswith("REGISTRATIONS ")]
    calls = json.loads(line.removeprefix("REGISTRATIONS "))
    assert "NixlConnector" in calls["early"]
    assert calls["later"] == []


def test_cpu_profile_reads_direct_streaming_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", "1")
    cpu, _ = to_cpu(tpu_serve_config(), MODEL)
    assert "ingress_deployment_config" not in cpu["applications"][0]["args"]
    monkeypatch.setenv("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", "0")
    cpu, _ = to_cpu(tpu_serve_config(), MODEL)
    assert cpu["applications"][0]["args"]["ingress_deployment_config"] == {
        "ray_actor_options": {"num_cpus": 0}
    }
