"""Hugging Face models through the training loop in this process (one gloo rank, no Ray):
the families vLLM serves, pretrained loading, SFT masking, export round trips, exact resume."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.workloads.train_fixtures import (  # noqa: F401  (fixtures)
    gloo_world1,
    one_rank_batches,
    tiny_llama_folder,
    tiny_tokenizer,
)
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.inputs import facts
from workloads.train.inputs.batches import IGNORE
from workloads.train.models import hf
from workloads.train.outputs import export
from workloads.train.run.loop import train
from workloads.train.testing import decoder_shape, facts_sft

pytestmark = pytest.mark.usefixtures("gloo_world1")


def _config(tmp_path: Path, **overrides: Any) -> TrainConfig:
    """park:tiny-llama on the facts chats: 4 steps of 4 chats of 64 tokens, a fast lr."""
    run = dict(seq_len=64, global_batch_size=4, steps=4, checkpoint_every=0, report_every=2)
    where = {"storage_path": str(tmp_path / "runs"), "run_name": "hf"}
    return facts_sft(**(run | {"lr": 3e-3, "warmup_steps": 2} | where | overrides))


def _final_export(cfg: TrainConfig) -> Path:
    return Path(cfg.storage_path) / cfg.run_name / "export" / "final"


def _checkpoint_weights(directory: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a DCP checkpoint, as full tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp_path / "consolidated.pt"
    dcp_to_torch_save(str(directory), str(target))
    saved = torch.load(target, weights_only=False)
    return {k: v for k, v in saved["model"].items() if isinstance(v, torch.Tensor)}


def _family_folder(tmp_path: Path, tokenizer: Any, family: str) -> Path:
    """A config of a family with the tiny tokenizer: pretraining such a model from scratch."""
    import transformers

    sizes = dict(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1, positions=128)
    shape = decoder_shape(**sizes, vocab=768, tokenizer=tokenizer)
    configs = {
        "llama": (transformers.LlamaConfig, {}),
        "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": True}),
        "qwen3": (transformers.Qwen3Config, {"head_dim": 32}),
        "mistral": (transformers.MistralConfig, {"sliding_window": None}),
        "gemma": (transformers.GemmaConfig, {"head_dim": 32}),
    }
    klass, extra = configs[family]
    folder = tmp_path / family
    klass(**shape, **extra).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _logits(model: Any, tokenizer: Any) -> torch.Tensor:
    chat = facts.records()[0]["messages"]
    ids = tokenizer.apply_chat_template(chat, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize(
    ("family", "strategy"),
    [
        ("llama", "ddp"),
        ("llama", "fsdp2"),
        ("qwen2", "ddp"),
        ("qwen2", "fsdp2"),
        ("qwen3", "fsdp2"),
        ("mistral", "fsdp2"),
        ("gemma", "fsdp2"),
    ],
)
def test_family_trains_and_its_export_gives_the_trained_logits(
    tmp_path: Path, tiny_tokenizer: Any, family: str, strategy: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _family_folder(tmp_path, tiny_tokenizer, family)
    cfg = _config(tmp_path, model=str(folder), init="config", strategy=strategy)
    env = LocalEnv(tmp_path / "ckpt")
    train(cfg, env)

    out = _final_export(cfg)
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert type(exported).__name__ == hf.architecture_of(exported)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert AutoTokenizer.from_pretrained(out).chat_template == tiny_tokenizer.chat_template
    assert (out / "generation_config.json").exists()
    marker = json.loads((out / export.MARKER_NAME).read_text())
    assert (marker["step"], marker["run_name"], marker["init"]) == (4, "hf", "config")
    # the marker is written last: a reader that finds it finds every other file (ready.py)
    last = (out / export.MARKER_NAME).stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= last for p in out.iterdir())
    # The weights are the trained ones: the final checkpoint's, to the bit, in transformers.
    weights = _checkpoint_weights(tmp_path / "ckpt" / "checkpoint_00000004", tmp_path)
    reference = AutoModelForCausalLM.from_config(exported.config)
    missing, unexpected = reference.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= hf.tied_export_keys(reference)
    reference.tie_weights()
    assert torch.equal(_logits(exported, tiny_tokenizer), _logits(reference, tiny_tokenizer))
    if exported.config.tie_word_embeddings:
        from safetensors import safe_open

        with safe_open(str(out / "model.safetensors"), "pt") as handle:
            assert "lm_head.weight" not in set(handle.keys())


def test_pretrained_weights_load_from_a_sharded_folder(tmp_path: Path, tiny_tokenizer: Any) -> None:
    """Run A exports in several safetensors files with an index; run B starts from that folder
    (DCP's Hugging Face reader) and its first loss is A's model's loss, not a random model's."""
    from transformers import AutoModelForCausalLM

    first = _config(tmp_path, steps=30, export_max_shard_size="200KB", run_name="a")
    train(first, LocalEnv(tmp_path / "a"))
    out = _final_export(first)
    index = json.loads((out / export.INDEX_NAME).read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) >= 3 and set(index["weight_map"].values()) == set(files)

    second = _config(
        tmp_path, model=str(out), strategy="fsdp2", steps=2, lr=1e-9, report_every=1, run_name="b"
    )
    assert second.init_mode == "pretrained"
    env = LocalEnv(tmp_path / "b")
    train(second, env)
    assert env.reports[0]["loss"] < 0.4 * math.log(len(tiny_tokenizer))  # a random model: 1.0
    weights = _checkpoint_weights(tmp_path / "b" / "checkpoint_00000002", tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for key, value in loaded.items():
        torch.testing.assert_close(weights[key], value, atol=1e-6, rtol=0)


def _prompt_and_response_loss(model: Any, tokenizer: Any) -> tuple[float, float]:
    """Mean next-token loss on the question tokens and on the answer tokens of every fact."""
    from workloads.train.inputs.text import Encoder

    encoder = Encoder(tokenizer, objective="sft")
    prompt, response = [], []
    for record in facts.records():
        doc = encoder.encode(record)
        assert doc is not None
        ids = torch.from_numpy(doc.ids)[None]
        with torch.no_grad():
            losses = F.cross_entropy(
                model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none"
            )
        is_response = torch.from_numpy(doc.mask[1:])
        # The prompt's words (after the user role token), not template tokens common to all.
        question = torch.zeros_like(is_response)
        question[2 : 2 + 6] = True
        prompt.append(losses[question & ~is_response])
        response.append(losses[is_response])
    return float(torch.cat(prompt).mean()), float(torch.cat(response).mean())


@pytest.mark.parametrize("objective", ["sft", "clm"])
def test_sft_learns_the_answers_and_not_the_questions(
    tmp_path: Path, tiny_tokenizer: Any, objective: str
) -> None:
    """SFT's loss ignores prompt tokens: after training, the answers are predicted and the
    questions are not. The same chats trained as plain text (clm) learn the questions too,
    which is what this test would see if the mask were lost."""
    from transformers import AutoModelForCausalLM

    cfg = _config(
        tmp_path,
        objective=objective,
        text_field="no-such-field",  # clm renders each record's chat through the template
        steps=80,
        global_batch_size=8,
        seq_len=128,
        warmup_steps=10,
    )
    train(cfg, LocalEnv(tmp_path / "ckpt"))
    model = AutoModelForCausalLM.from_pretrained(_final_export(cfg))
    prompt_loss, response_loss = _prompt_and_response_loss(model, tiny_tokenizer)
    if objective == "sft":
        assert response_loss < 0.05
        assert prompt_loss > 3.0, "prompt tokens were trained on"
    else:
        # Trained on: only the country is left to guess (ln 16 over a 6-token question).
        assert prompt_loss < 1.0


def test_sft_loss_is_the_mean_over_response_tokens(tiny_tokenizer: Any) -> None:
    """The loop's loss on a packed SFT batch is the cross-entropy of the response tokens only."""
    from workloads.train.inputs.text import Encoder, plan_units

    units, encoder = plan_units(str(facts.facts_path())), Encoder(tiny_tokenizer, objective="sft")
    pad = tiny_tokenizer.pad_token_id
    batches = one_rank_batches(
        units, encoder, seq_len=64, batch_size=2, split_documents=False, pad_id=pad
    )
    batch = batches.next_batch()
    answers = {t for a in facts.questions().values() for t in tiny_tokenizer(a)["input_ids"]}
    trained = batch.labels[batch.labels != IGNORE]
    assert set(trained.tolist()) <= answers | {tiny_tokenizer.eos_token_id}
    assert batch.n_targets == len(trained) and 0 < len(trained) < batch.labels.numel() / 4


def test_resume_continues_exactly_where_it_stopped(tmp_path: Path) -> None:
    """Weights, optimizer moments and the data stream's position all come back: the same
    losses as without a stop (a restarted data stream would repeat the first batches)."""
    cfg = _config(tmp_path, steps=12, checkpoint_every=6, report_every=3, export=False)
    straight = LocalEnv(tmp_path / "straight")
    train(cfg, straight)

    resumed = LocalEnv(tmp_path / "resumed")
    resumed.root.mkdir()
    shutil.copytree(straight.root / "checkpoint_00000006", resumed.root / "checkpoint_00000006")
    state = train(cfg, resumed)

    assert state.step == 12 and state.resumes == 1
    assert [r["step"] for r in resumed.reports] == [9, 12]
    saved = json.loads(
        (straight.root / "checkpoint_00000006/data_state/rank-00000.json").read_text()
    )
    assert saved["step"] == 6 and saved["documents"] > 0
    for a, b in zip(straight.reports[2:], resumed.reports, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_export_every_n_checkpoints_to_a_bucket_uri(tmp_path: Path) -> None:
    """--export-every, to a URI through pyarrow's filesystems (file:// here, gs:// on GKE)."""
    bucket = tmp_path / "bucket"
    cfg = _config(
        tmp_path,
        steps=6,
        checkpoint_every=2,
        export_every=2,
        export_path=f"file://{bucket}/exports",
        export_max_shard_size="300KB",
    )
    train(cfg, LocalEnv(tmp_path / "ckpt"))
    assert sorted(p.name for p in (bucket / "exports").iterdir()) == ["final", "step_00000004"]
    step = bucket / "exports" / "step_00000004"
    assert json.loads((step / export.MARKER_NAME).read_text())["step"] == 4
    assert (step / export.INDEX_NAME).exists() and (step / "config.json").exists()


# ---- sources and their errors -------------------------------------------------------------------


def test_sources_are_refused_with_the_flag_to_fix(
    tmp_path: Path, tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import MixtralConfig

    with pytest.raises(hf.ModelError, match="no safetensors weights"):
        hf.load_source(_config(tmp_path, model=str(tiny_llama_folder), init="pretrained"))
    moe = tmp_path / "moe"
    MixtralConfig(vocab_size=800, hidden_size=32, num_hidden_layers=1).save_pretrained(moe)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_folder / name, moe / name)
    with pytest.raises(hf.ModelError, match="mixtral is a mixture of experts"):
        hf.load_source(_config(tmp_path, model=str(moe), init="config"))
    with pytest.raises(hf.ModelError, match="not a folder here"):
        hf.resolve_folder(str(tmp_path / "missing"), weights=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PARK_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(hf.ModelError, match="HF_TOKEN_PATH"):
        hf.resolve_folder("org/not-downloaded", weights=True)


def test_a_gs_folder_is_mirrored_once_per_node(
    tmp_path: Path, tiny_llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gs:// path, through pyarrow's file:// filesystem (same code, another scheme)."""
    monkeypatch.setenv("PARK_CACHE_DIR", str(tmp_path / "cache"))
    bucket = tmp_path / "bucket" / "model"
    shutil.copytree(tiny_llama_folder, bucket)
    (bucket / "optimizer.pt").write_bytes(b"not for us")
    local = hf.resolve_folder(f"file://{bucket}", weights=True)
    assert sorted(os.listdir(local)) == sorted([*os.listdir(tiny_llama_folder), ".complete"])
    stamp = (local / "config.json").stat().st_mtime_ns
    assert hf.resolve_folder(f"file://{bucket}", weights=True) == local
    assert (local / "config.json").stat().st_mtime_ns == stamp


def test_flops_per_token_is_6n_plus_attention(tiny_llama_folder: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_llama_folder)
    model = hf.meta_model(config)
    n = sum(p.numel() for p in model.parameters()) - config.vocab_size * config.hidden_size
    heads, head_dim = config.num_attention_heads, config.head_dim
    assert hf.train_flops_per_token(model, config, 64) == 6 * n + 12 * 2 * heads * head_dim * 64


def test_export_shards_are_planned_like_save_pretrained() -> None:
    sizes = [("a", 4), ("b", 4), ("c", 9), ("d", 1)]
    assert export.plan_shards(sizes, 8) == [["a", "b"], ["c"], ["d"]]
    assert export.plan_shards(sizes, 100) == [["a", "b", "c", "d"]]
    assert export.shard_names(1) == ["model.safetensors"]
    assert export.shard_names(2)[1] == "model-00002-of-00002.safetensors"
    assert export.export_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert export.export_dtype("auto", torch.float32) == torch.float32
    assert export.export_dtype("bfloat16", torch.float32) == torch.bfloat16
