"""One rule set for the models the trainer trains (workloads/train/models/model_rules.py), held
against transformers' own classes and conversion table, asked alike by preview and the worker on
every catalogued model's real config.json, and a tiny Gemma 3 / Gemma 4 multimodal checkpoint
trained through the real loader and exporter (one gloo rank, no Ray).

The references: transformers' AutoModelForCausalLM and conversion_mapping as installed, the real
config.json files in infra/data/models/configs.json, and transformers' multimodal classes, whose
logits on text the exported text-only model must give.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from infra import model_lookup, rules
from infra.schema.read import parse_values, read_stack_file
from tests.conftest import STACKS_DIR
from tests.workloads.train_fixtures import (  # noqa: F401  (fixtures)
    gloo_world1,
    tiny_llama_folder,
    tiny_tokenizer,
)
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.models import hf, model_rules
from workloads.train.run.loop import train
from workloads.train.testing import decoder_shape, facts_sft

ROOT = Path(__file__).resolve().parents[2]
CONFIGS: dict[str, Any] = json.loads((ROOT / "infra/data/models/configs.json").read_text())[
    "models"
]


def _traits(repo: str) -> model_rules.ModelTraits:
    return model_rules.traits_of_config(CONFIGS[repo]["config"])


# ---- the rule on real configs ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("repo", "builds"),
    [
        ("google/gemma-3-4b-it", "Gemma3ForCausalLM"),  # multimodal: its text model
        ("google/gemma-3-1b-it", "Gemma3ForCausalLM"),
        ("google/gemma-4-E2B-it", "Gemma4ForCausalLM"),  # multimodal, dense
        ("Qwen/Qwen3-8B", "Qwen3ForCausalLM"),
        ("meta-llama/Llama-3.1-8B", "LlamaForCausalLM"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "MistralForCausalLM"),
    ],
)
def test_a_trainable_model_is_the_causal_lm_transformers_builds_from_its_text_config(
    repo: str, builds: str
) -> None:
    """What the rule says the trainer builds is what transformers builds from the model's
    (text) config, and transformers loads that class's checkpoints without converting keys."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    traits = _traits(repo)
    assert model_rules.refusal(traits) is None
    assert model_rules.trained_architecture(traits) == builds
    config = CONFIGS[repo]["config"]
    text = AutoConfig.for_model(**config).get_text_config(decoder=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text)
    assert type(model).__name__ == builds
    assert get_checkpoint_conversion_mapping(text.model_type) is None


@pytest.mark.parametrize(
    ("repo", "experts"),
    [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 8),
        ("Qwen/Qwen3-30B-A3B", 128),
        ("google/gemma-4-26B-A4B-it", 128),  # multimodal and MoE
        ("deepseek-ai/DeepSeek-V2-Lite", 64),
    ],
)
def test_a_mixture_of_experts_is_refused_with_what_is_allowed(repo: str, experts: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    reason = model_rules.refusal(_traits(repo))
    assert reason is not None
    assert f"mixture of experts ({experts} routed experts)" in reason
    assert model_rules.REFUSED in reason and "Qwen3ForCausalLM" in reason
    # transformers' own model has routed experts: the count the rule read is the model's
    text = AutoConfig.for_model(**CONFIGS[repo]["config"]).get_text_config(decoder=True)
    text.num_hidden_layers = 2  # DeepSeek's first layer is dense (first_k_dense_replace)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text)
    assert any(".experts." in name for name, _ in model.named_parameters())


def test_unknown_and_unsupported_multimodal_architectures_are_refused_with_the_list() -> None:
    bert = dict(CONFIGS["Qwen/Qwen3-1.7B"]["config"], architectures=["BertForMaskedLM"])
    reason = model_rules.refusal(model_rules.traits_of_config(bert))
    assert reason is not None and reason.startswith("BertForMaskedLM: ")
    assert "LlamaForCausalLM" in reason and "Gemma3ForConditionalGeneration" in reason
    vision = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "text_config": CONFIGS["Qwen/Qwen3-1.7B"]["config"],
    }
    reason = model_rules.refusal(model_rules.traits_of_config(vision))
    assert reason is not None and "multimodal checkpoint" in reason
    # a config.json saved from a config class has no architectures: its model_type names it
    bare = {"model_type": "qwen3", "architectures": None}
    assert model_rules.trained_architecture(model_rules.traits_of_config(bare)) == (
        "Qwen3ForCausalLM"
    )


def test_every_allowed_family_is_one_transformers_loads_without_converting_keys() -> None:
    """The rule's list against transformers' own tables: the class AutoModelForCausalLM makes
    of each model_type, and the load-time conversions."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for model_type, architecture in model_rules.CAUSAL_LMS.items():
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type] == architecture
        assert get_checkpoint_conversion_mapping(model_type) is None, model_type


# ---- preview and the worker agree -------------------------------------------------------------


def _model_folder(tmp_path: Path, repo: str, tokenizer_folder: Path) -> Path:
    """A folder with a catalogued model's real config.json and a tokenizer (no weights)."""
    folder = tmp_path / repo.replace("/", "--")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS[repo]["config"]))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_folder / name, folder / name)
    return folder


def _preview_refusals(model: str) -> list[str]:
    """What `park validate` says about park:training.model = `model` under the model rule."""
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    values = copy.deepcopy(values)
    values["park:training"] = {**values["park:training"], "model": model}
    values["park:serving"] = {"enabled": False}
    values["park:hfToken"] = "[secret]"
    found = rules.problems(parse_values(values, "dev", ["park:hfToken"]))
    return [
        p.message for p in found if p.key == model_rules.KEY and model_rules.REFUSED in p.message
    ]


def _sft_on_facts(tmp_path: Path, model: Path, **more: Any) -> TrainConfig:
    """One CPU worker fine-tuning `model` on the built-in facts chats (64 tokens, batch 4)."""
    where = str(tmp_path / "runs")
    return facts_sft(model=str(model), seq_len=64, global_batch_size=4, storage_path=where, **more)


def _worker_refusal(tmp_path: Path, folder: Path) -> str | None:
    cfg = _sft_on_facts(tmp_path, folder, init="config")
    try:
        source = hf.load_source(cfg)
    except hf.ModelError as err:
        return str(err)
    # what the worker then builds is the class transformers makes of the trained config
    with torch.device("meta"):
        config = copy.deepcopy(source.config)
        config.num_hidden_layers = 1
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:1]
        config.num_kv_shared_layers = 0
        built = hf.meta_model(config)
    assert hf.architecture_of(built) == source.config.architectures[0]
    return None


@pytest.mark.parametrize("repo", sorted(CONFIGS))
def test_preview_and_the_worker_refuse_the_same_models_with_the_same_words(
    tmp_path: Path, tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch, repo: str
) -> None:
    """Preview reads the catalogue (hub id, offline) and the folder; the worker reads the
    folder's config.json through load_source: one decision, one message, every model."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = _model_folder(tmp_path, repo, tiny_llama_folder)
    worker = _worker_refusal(tmp_path, folder)
    for model in (repo, str(folder)):
        preview = _preview_refusals(model)
        if worker is None:
            assert preview == [], (model, preview)
        else:
            (said,) = preview
            assert worker == hf.refusal_message(str(folder), said), (worker, said)
    facts = model_lookup.lookup(repo).facts
    assert facts is not None and facts.model_type == CONFIGS[repo]["config"]["model_type"]


# ---- the text model of a multimodal checkpoint trains --------------------------------------


def _tiny_multimodal(tmp_path: Path, tokenizer: Any, repo: str) -> Path:
    """A multimodal checkpoint shaped like `repo`'s real config, shrunk, random weights, saved
    by transformers itself (so in the layout it writes: Gemma 3 legacy, Gemma 4 its own)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    real = copy.deepcopy(CONFIGS[repo]["config"])
    vocab = len(tokenizer) + 8
    text = real["text_config"]
    sizes = dict(hidden=64, intermediate=128, heads=2, kv_heads=1, positions=256, vocab=vocab)
    text.update(decoder_shape(**sizes, tokenizer=tokenizer), head_dim=32, sliding_window=16)
    vision = real["vision_config"]
    vision.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    if real["model_type"] == "gemma3":
        text.update(num_hidden_layers=2)
        vision.update(image_size=28, patch_size=14)
        real.update(mm_tokens_per_image=4, image_token_index=vocab - 3)
        real.update(boi_token_index=vocab - 2, eoi_token_index=vocab - 1)
    else:  # Gemma 4: sliding and full layers, the last two sharing the KV of earlier ones
        text.update(
            num_hidden_layers=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            num_kv_shared_layers=2,
            global_head_dim=64,
            vocab_size_per_layer_input=vocab,
            hidden_size_per_layer_input=16,
        )
        vision.update(num_key_value_heads=2, head_dim=16, global_head_dim=16)
        for offset, name in enumerate(
            ("image", "boi", "eoi", "audio", "boa", "eoa", "video"), start=1
        ):
            real[f"{name}_token_id"] = vocab - offset
        real.update(eoa_token_index=real["eoa_token_id"], eos_token_id=tokenizer.eos_token_id)
    config = AutoConfig.for_model(**real)
    model = AutoModelForImageTextToText.from_config(config)
    with torch.no_grad():  # no tensor left at its init value (norms at 0, Gemma 4's scalars at 1)
        for tensor in [*model.parameters(), *model.state_dict().values()]:
            tensor.add_(torch.rand_like(tensor) * 0.1)
    folder = tmp_path / "source"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize(
    ("repo", "strategy"),
    [
        ("google/gemma-3-4b-it", "fsdp2"),
        ("google/gemma-4-E2B-it", "fsdp2"),
        ("google/gemma-4-E2B-it", "ddp"),
    ],
)
def test_the_text_model_of_a_multimodal_checkpoint_trains_and_exports_text_only(
    tmp_path: Path, tiny_tokenizer: Any, repo: str, strategy: str
) -> None:
    """The trainer reads the text model's weights from under the checkpoint's prefix, trains
    a step, and exports a text-only causal LM whose logits are the multimodal model's on text
    (transformers' own class, loaded from the source checkpoint)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    source = _tiny_multimodal(tmp_path, tiny_tokenizer, repo)
    cfg = _sft_on_facts(
        tmp_path,
        source,
        init="pretrained",
        strategy=strategy,
        lr=1e-9,  # the exported weights stay the source's, to compare
        warmup_steps=0,
        steps=1,
        checkpoint_every=0,
        report_every=1,
        run_name="mm",
    )
    env = LocalEnv(tmp_path / "ckpt")
    train(cfg, env)
    assert torch.isfinite(torch.tensor(env.reports[0]["loss"]))

    out = tmp_path / "runs" / "mm" / "export" / "final"
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    traits = model_rules.traits_of_config(json.loads((source / "config.json").read_text()))
    assert type(exported).__name__ == model_rules.trained_architecture(traits)
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys == set(exported.state_dict()) - hf.tied_export_keys(exported)

    reference = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32)
    ids = tiny_tokenizer("the trainer reads the text model", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = reference(input_ids=ids).logits
        got = exported(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize("repo", ["google/gemma-3-4b-it", "google/gemma-4-E2B-it"])
def test_the_text_model_of_a_multimodal_config_learns_from_random_weights(
    tmp_path: Path, tiny_tokenizer: Any, repo: str
) -> None:
    """``--init config`` under FSDP2: each module's own init on the sharded blocks (Gemma 4's
    blocks hold a buffer of their own), then the loss falls."""
    source = _tiny_multimodal(tmp_path, tiny_tokenizer, repo)
    cfg = _sft_on_facts(
        tmp_path,
        source,
        init="config",
        strategy="fsdp2",
        lr=3e-3,
        warmup_steps=1,
        steps=6,
        checkpoint_every=0,
        report_every=1,
        export=False,
        run_name="mm",
    )
    env = LocalEnv(tmp_path / "ckpt")
    train(cfg, env)
    losses = [report["loss"] for report in env.reports]
    assert losses[-1] < losses[0], losses
