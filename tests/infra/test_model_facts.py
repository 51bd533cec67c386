"""Serving that knows the model: facts read the way vLLM reads config.json, checked against
transformers; every rule the engine applies, tried on broken model/slice combinations.

References nobody here wrote: transformers builds each catalogued config.json (its parameter
count must be the catalogue's), and a model built here loads in transformers (its config.json
and safetensors must give the facts the loader reads).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import yaml

from infra import catalog, engine, model_facts, model_lookup
from infra.plan import ray as ray_plan
from infra.schema.errors import ConfigError
from infra.stack import from_values
from tests.conftest import ROOT, SHIPPED_STACKS, render_stack
from tests.infra.serving_stack import serving_values

CONFIGS = json.loads((ROOT / "infra/data/models/configs.json").read_text())["models"]
CATALOGUE = yaml.safe_load((ROOT / "infra/data/models/catalogue.yaml").read_text())["models"]


# ---- the catalogue against transformers ------------------------------------------------------


def _build(repo: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    entry = CONFIGS[repo]
    config = dict(entry["config"])
    built = transformers.CONFIG_MAPPING[config.pop("model_type")](**config)
    factory = (
        transformers.AutoModelForCausalLM
        if entry["kind"] == "causal"
        else transformers.AutoModelForImageTextToText
    )
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return built, factory.from_config(built)


@pytest.mark.parametrize("repo", sorted(CATALOGUE))
def test_catalogue_parameters_are_what_transformers_builds(repo):
    _, model = _build(repo)
    count = sum(p.numel() for p in model.parameters())
    if "params" in (CATALOGUE[repo].get("unverified") or []):
        # e.g. gemma-4-E2B-it: its HF checkpoint adds an audio tower the stored config omits
        assert abs(count - CATALOGUE[repo]["params"]) / count < 0.1
    else:
        assert count == CATALOGUE[repo]["params"]


@pytest.mark.parametrize("repo", sorted(CATALOGUE))
def test_catalogue_facts_are_what_its_config_json_says(repo):
    """The loader that reads a model folder, on the stored config.json, agrees with the
    catalogue's own fields: the two readings of one file."""
    read = model_facts.facts_from_config(CONFIGS[repo]["config"], repo)
    listed = model_facts.from_catalogue(repo)
    assert listed is not None
    for field in ("layers", "hidden_size", "attention_heads", "kv_heads", "head_dim", "vocab_size"):
        assert getattr(read, field) == getattr(listed, field), field
    assert read.architecture == listed.architecture
    assert read.experts == listed.experts
    assert read.max_positions == listed.max_positions
    assert (read.mla_kv_dim is None) == (listed.mla_kv_dim is None)


def test_aliases_resolve_with_their_overrides():
    instruct = model_facts.from_catalogue("Qwen/Qwen3-30B-A3B-Instruct-2507")
    base = model_facts.from_catalogue("Qwen/Qwen3-30B-A3B")
    assert instruct and base
    assert instruct.max_positions == 262144 and base.max_positions == 40960
    assert instruct.params == base.params and instruct.moe


# ---- a model folder built here ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("transformers")
    import os

    from workloads.serve.tiny_model import build_tiny_model

    os.environ.setdefault("PARK_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return build_tiny_model()


def test_a_local_folders_facts_match_transformers(tiny_model):
    import transformers

    facts = model_lookup.from_folder(tiny_model)
    config = transformers.AutoConfig.from_pretrained(tiny_model)
    assert facts.architecture == config.architectures[0]
    assert (facts.layers, facts.attention_heads, facts.kv_heads) == (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
    )
    assert facts.head_dim == getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    assert facts.max_positions == config.max_position_embeddings
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    assert facts.params == sum(p.numel() for p in model.parameters())  # from the safetensors
    assert not facts.params_estimated


def test_a_folder_without_config_json_or_with_bad_json_is_an_error(tmp_path):
    lookup = model_lookup.lookup(str(tmp_path))
    assert lookup.facts is None and "no config.json" in (lookup.error or "")
    (tmp_path / "config.json").write_text('{"hidden_size": 8,\n  oops}')
    lookup = model_lookup.lookup(str(tmp_path))
    assert "config.json: not JSON (line 2" in (lookup.error or "")


def test_a_uri_is_read_through_pyarrow(tiny_model):
    pytest.importorskip("pyarrow")
    facts = model_lookup.from_uri(f"file://{tiny_model}")  # the gs:// path, on a local filesystem
    assert facts.params == model_lookup.from_folder(tiny_model).params


# ---- the rules, on broken combinations -------------------------------------------------------


def _model(source: str, **fields) -> dict:
    return {"name": fields.pop("name", "m"), "source": source, **fields}


BROKEN = {
    # name: (values, key, text the message must contain)
    "heads: 12 heads, TP 8": (
        serving_values("host", _model("Qwen/Qwen2.5-1.5B-Instruct", tensorParallelSize=8)),
        "park:serving.models[0].tensorParallelSize",
        "12 attention heads are not divisible by TP 8",
    ),
    "TP on a multi-host slice below its chips": (
        serving_values("slice", _model("Qwen/Qwen3-8B", tensorParallelSize=8)),
        "park:serving.models[0].tensorParallelSize",
        "its Ray executor takes every chip of the slice; allowed: 16",
    ),
    "HBM: a 235B MoE model on 8 chips": (
        serving_values("host", _model("Qwen/Qwen3-235B-A22B", tensorParallelSize=8)),
        "park:serving.models[0].maxModelLen",
        "needs",
    ),
    "context beyond the model's positions": (
        serving_values("host", _model("Qwen/Qwen3-1.7B", tensorParallelSize=8, maxModelLen=65536)),
        "park:serving.models[0].maxModelLen",
        "has 40960 positions",
    ),
    "expert parallel on a dense model": (
        serving_values(
            "host", _model("Qwen/Qwen3-1.7B", tensorParallelSize=8, enableExpertParallel=True)
        ),
        "park:serving.models[0].enableExpertParallel",
        "is dense",
    ),
    "two replicas on multi-host slices under one RayService": (
        serving_values(
            "slice", _model("Qwen/Qwen3-30B-A3B", maxReplicas=2, enableExpertParallel=True)
        ),
        "park:serving.models[0].maxReplicas",
        "builds its slice from every TPU host of the cluster",
    ),
    "gated model without a token": (
        serving_values("host", _model("meta-llama/Llama-3.1-8B-Instruct", tensorParallelSize=8)),
        "park:hfToken",
        "is gated on the Hugging Face hub",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_model_slice_combinations_are_refused(case):
    values, key, text = BROKEN[case]
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    found = {p.key: p.message for p in info.value.problems}
    assert key in found, found
    assert text in found[key], found[key]


def test_kv_heads_that_tp_neither_divides_nor_is_divided_by(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    config = dict(
        CONFIGS["Qwen/Qwen3-1.7B"]["config"], num_attention_heads=24, num_key_value_heads=12
    )
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as info:
        from_values(serving_values("host", _model(str(folder), tensorParallelSize=8)), "dev")
    (problem,) = [p for p in info.value.problems if p.key.endswith("tensorParallelSize")]
    assert (
        "12 KV heads and TP 8" in problem.message
        and "allows on this slice: 1, 4" in problem.message
    )


def test_googles_gemma_4_sample_shape_is_accepted():
    """serve_vllm_torchtpu.py: gemma-4-26B-A4B-it, TP 16 on a v6e 4x4, expert parallel (its
    full-attention layers' 2 KV heads are replicated, TP 16 being a multiple of them)."""
    values = serving_values(
        "slice",
        _model("google/gemma-4-26B-A4B-it", tensorParallelSize=16, enableExpertParallel=True),
    )
    plan = from_values(values, "dev")
    assert plan.serving and plan.serving.models[0].fit and plan.serving.models[0].fit.fits


def test_an_architecture_the_engine_does_not_serve(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    config = dict(CONFIGS["Qwen/Qwen3-1.7B"]["config"], architectures=["BertForMaskedLM"])
    (folder / "config.json").write_text(json.dumps(config))
    values = serving_values("host", _model(str(folder), tensorParallelSize=8))
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    (problem,) = [p for p in info.value.problems if p.key == "park:serving.models[0].source"]
    assert "BertForMaskedLM is not one vLLM 0.29.0 serves" in problem.message


def test_an_unknown_model_offline_is_a_warning_that_says_how_to_supply_facts():
    plan = from_values(
        serving_values("host", _model("someone/new-model", tensorParallelSize=8)), "dev"
    )
    (warning,) = [w for w in plan.warnings if w.key == "park:serving.models[0].source"]
    assert "no model facts here" in warning.message and "catalogue.yaml" in warning.message
    assert plan.serving and plan.serving.models[0].fit is None


def test_the_cli_prints_the_fit_and_the_unknown_model_warning(tmp_path):
    path = tmp_path / "Pulumi.w.yaml"
    config = serving_values("host", _model("someone/new-model", tensorParallelSize=8))
    path.write_text(yaml.safe_dump({"config": config}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.tools.cli",
            "cost",
            "w",
            "--details",
            "--config-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "serving fit" in done.stdout and "someone/new-model" not in done.stderr


# ---- the shipped stacks ----------------------------------------------------------------------


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_shipped_model_is_known_and_fits(stack):
    plan = render_stack(stack).plan
    assert plan.serving is not None or plan.rl is not None
    if plan.serving is None:  # an RL stack: its rollout engines' model, by the same rules
        rollout = plan.rl.rollout
        assert plan.rl.facts.facts is not None, plan.rl.facts.reason
        assert rollout.fit is not None and rollout.fit.fits
        assert not engine.head_problems(plan.rl.facts.facts, rollout.tensor_parallel)
        return
    for model in plan.serving.models:
        assert model.facts.facts is not None, model.facts.reason
        assert model.fit is not None and model.fit.fits
        assert not engine.head_problems(model.facts.facts, model.tensor_parallel)
    assert not [w for w in plan.warnings if ".source" in w.key]


def test_prod_serves_an_moe_model_on_the_whole_slice_with_expert_parallel():
    plan = render_stack("prod").plan
    (model,) = plan.serving.models
    assert (model.tensor_parallel, plan.serving.pool.slice.topology) == (16, "4x4")
    assert model.spec.enable_expert_parallel and model.facts.facts.moe
    assert model.spec.max_model_len == 8192


def test_fit_figures_by_hand():
    """Qwen3-30B-A3B at TP 16 on v6e: 30,532,122,624 bf16 parameters / 16 = 3.55 GiB per chip;
    4 KV heads / 16 → 1 per chip, padded to the bf16 pair: 2 x 128 x 2 bytes = 512 B per layer
    per token, x 48 layers = 24,576 B; an 8192-token sequence 192 MiB; 31.25 GiB (as the
    runtime reports it) x 0.92 = 28.75, less the engine's reserve (test_engine_fit.py)."""
    facts = model_facts.from_catalogue("Qwen/Qwen3-30B-A3B")
    assert facts is not None
    fit = engine.fit(facts, catalog.lookup("ct6e-standard-4t", "4x4"), 16, 8192)
    assert fit.weights_gib == pytest.approx(30532122624 * 2 / 16 / 1024**3)
    assert fit.kv_bytes_per_token == 24576
    assert fit.kv_gib_per_sequence == pytest.approx(192 / 1024)
    assert fit.usable_gib == pytest.approx(28.75, abs=0.01)
    assert fit.sequences == int(fit.kv_cache_gib / (192 / 1024))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_replicas_start_warm_from_a_keyed_compile_cache(stack):
    rendered = render_stack(stack)
    services = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    if not services:
        pytest.skip("no RayService (an RL stack's engines compile in its RayJob)")
    (service,) = services
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    for llm in serve["applications"][0]["args"]["llm_configs"]:
        env = llm["runtime_env"]["env_vars"]
        assert "VLLM_DISABLE_COMPILE_CACHE" not in env
        root = f"{rendered.config.storage.mount_path}/cache/"
        tier3 = env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"]
        assert tier3.startswith(root + "torch-tpu/") and env["VLLM_CACHE_ROOT"].startswith(root)
        model = llm["model_loading_config"]["model_id"]
        assert model in tier3 and rendered.plan.serving.pool.slice.topology in tier3
        assert llm["placement_group_config"] == {"bundle_per_worker": {"TPU": 1}}
        assert llm["deployment_config"]["health_check_timeout_s"] == ray_plan.HEALTH_CHECK_TIMEOUT_S


def test_compile_cache_keys_differ_by_model_topology_and_tp():
    plan = render_stack("prod").plan
    serving = plan.serving
    keys = {
        ray_plan.compile_cache_key(serving, "a", 16),
        ray_plan.compile_cache_key(serving, "b", 16),
        ray_plan.compile_cache_key(serving, "a", 8),
        ray_plan.compile_cache_key(render_stack("dev").plan.serving, "a", 16),
    }
    assert len(keys) == 4


def test_a_sub_host_tp_gets_its_own_torch_tpu_topology():
    """dev's model at TP 4 on its 8-chip host: the engine sees a 2x2 of the 2x4."""
    from infra.stack import from_values
    from tests.conftest import STACKS_DIR

    values = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())["config"]
    values["park:serving"]["models"][0]["tensorParallelSize"] = 4
    plan = from_values(values, "dev")
    serving = plan.serving
    assert serving.models[0].tensor_parallel == 4 and serving.pool.slice.chips == 8
    config = ray_plan.serve_config(serving, ray_plan.ray_pods(plan))
    env = config["applications"][0]["args"]["llm_configs"][0]["runtime_env"]["env_vars"]
    assert env["TORCH_TPU_TOPOLOGY"] == "2,2,1"
    assert "TPU_MULTIHOST_BACKEND" not in env  # one host: the multiprocess executor
