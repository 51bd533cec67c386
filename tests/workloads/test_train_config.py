"""The entrypoint's flags, config file, validation and resolution (no cluster, no torch)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.infra.goldens import golden_manifests
from workloads.flags import ConfigError
from workloads.protocol import training_export_path, training_export_root
from workloads.train.__main__ import main
from workloads.train.config import TrainConfig, detect_accelerator, to_entrypoint
from workloads.train.config_check import parse_args, resolve
from workloads.train.config_rules import (
    data_kind,
    default_torch_tpu_topology,
    parse_size,
    topology_chips,
)

CONTRACT_FLAGS = [
    "--accelerator",
    "--num-workers",
    "--tpu-topology",
    "--tpu-accelerator-type",
    "--torch-tpu-topology",
    "--chips-per-host",
    "--num-slices",
    "--peak-tflops-per-device",
    "--strategy",
    "--model-size",
    "--steps",
    "--global-batch-size",
    "--micro-batch-size",
    "--seq-len",
    "--lr",
    "--warmup-steps",
    "--checkpoint-every",
    "--storage-path",
    "--run-name",
    "--max-failures",
    "--data",
    "--report-every",
    # Hugging Face models, text data, exports.
    "--model",
    "--tokenizer",
    "--init",
    "--objective",
    "--data-split",
    "--text-field",
    "--messages-field",
    "--prompt-field",
    "--response-field",
    "--lr-schedule",
    "--min-lr-ratio",
    "--export",
    "--export-every",
    "--export-path",
    "--export-dtype",
    "--export-max-shard-size",
]

TPU_4X4 = ["--accelerator", "tpu", "--tpu-topology", "4x4", "--chips-per-host", "4"]


def test_every_contract_flag_exists() -> None:
    from workloads.train.config import build_parser

    known = {option for action in build_parser()._actions for option in action.option_strings}
    assert set(CONTRACT_FLAGS) <= known


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert all(flag in text for flag in CONTRACT_FLAGS)


def test_defaults_need_no_flags() -> None:
    cfg = parse_args([])
    assert (cfg.accelerator, cfg.strategy, cfg.model_size, cfg.data) == (
        "auto",
        "ddp",
        "tiny",
        "synthetic",
    )


def test_cli_flags_win_over_config_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({"steps": 7, "model-size": "small", "global_batch_size": 16, "lr": "1e-3"})
    )
    cfg = parse_args(["--config", str(path), "--steps", "9"])
    assert cfg.steps == 9
    assert cfg.model_size == "small"
    assert cfg.global_batch_size == 16
    assert cfg.lr == pytest.approx(1e-3)


def test_json_config_and_unknown_keys(tmp_path: Path) -> None:
    good = tmp_path / "run.json"
    good.write_text(json.dumps({"strategy": "fsdp2", "compile": "true"}))
    cfg = parse_args(["--config", str(good)])
    assert cfg.strategy == "fsdp2" and cfg.compile is True
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stepz": 3}))
    with pytest.raises(ConfigError, match="unknown config keys: stepz"):
        parse_args(["--config", str(bad)])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--accelerator", "tpu"], "needs --tpu-topology"),
        ([*TPU_4X4, "--num-workers", "6"], "multiple of --chips-per-host"),
        ([*TPU_4X4, "--num-workers", "8"], "must equal the chips"),
        ([*TPU_4X4, "--num-slices", "2", "--num-workers", "16"], r"\(32\)"),
        ([*TPU_4X4, "--torch-tpu-topology", "2,2,1"], "has 4 chips"),
        (
            ["--accelerator", "tpu", "--tpu-topology", "4x4", "--chips-per-host", "3"],
            "whole number of hosts",
        ),
        (["--accelerator", "tpu", "--tpu-topology", "four"], "not of the form"),
        (["--global-batch-size", "9", "--num-workers", "2"], "multiple of --num-workers"),
        (["--steps", "0"], "--steps must be > 0"),
        (["--data", "corpus.csv"], "expected 'synthetic'"),
        (["--data", "corpus.parquet"], "text records need a tokenizer, so --model"),
        (["--run-name", "a/b"], "--run-name"),
        (["--objective", "sft"], "--objective sft needs --model"),
        (["--model", "park:tiny-llama", "--objective", "sft"], "not --data synthetic"),
        (["--model", "m/m", "--objective", "sft", "--data", "a.txt"], "a .txt file has only"),
        (["--model", "park:gpt5"], "built-in models are park:tiny-llama"),
        (["--model", "park:tiny-llama", "--init", "pretrained"], "use --init config"),
        (["--model", "m/m", "--vocab-size", "10"], "--vocab-size only applies"),
        (["--init", "pretrained"], "--init pretrained needs --model"),
        (["--export-every", "2"], "--export-every needs --model"),
        (["--export-max-shard-size", "big"], "--export-max-shard-size"),
        (["--model", "m/m", "--data", "park:wiki"], "built-in data sets are park:facts"),
        (["--model", "m/m", "--data", "hf:"], "needs a data set name"),
        (["--min-lr-ratio", "2"], "--min-lr-ratio"),
        (
            ["--global-batch-size", "16", "--num-workers", "2", "--micro-batch-size", "3"],
            r"--micro-batch-size 3 does not divide the 8 sequences .* one of 1, 2, 4, 8$",
        ),
        (
            ["--global-batch-size", "16", "--num-workers", "2", "--micro-batch-size", "16"],
            "--micro-batch-size 16 does not divide",
        ),
        (["--micro-batch-size", "0"], "--micro-batch-size must be > 0"),
    ],
)
def test_invalid_combinations_say_which_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_micro_batches_and_activation_checkpointing_parse() -> None:
    argv = ["--global-batch-size", "16", "--num-workers", "2", "--micro-batch-size", "2"]
    assert parse_args(argv).micro_batch_size == 2
    assert parse_args(["--micro-batch-size", "2"]).micro_batch_size == 2  # checked at resolve
    with pytest.raises(ConfigError, match="--micro-batch-size 3"):
        resolve(parse_args(["--global-batch-size", "8", "--micro-batch-size", "3"]), {})
    assert parse_args(["--activation-checkpointing"]).activation_checkpointing  # presets too


def test_main_reports_config_errors_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--accelerator", "tpu"]) == 2
    assert "--tpu-topology" in capsys.readouterr().err


def test_resolve_fills_worker_counts_and_topology() -> None:
    tpu = resolve(parse_args(TPU_4X4), {"TPU": 16.0, "CPU": 64.0})
    assert (tpu.num_workers, tpu.torch_tpu_topology) == (16, "4,4,1")
    multi = resolve(parse_args([*TPU_4X4, "--num-slices", "2"]), {})
    assert multi.num_workers == 32
    assert resolve(parse_args([]), {"CPU": 2.0}).num_workers == 2
    gpu = resolve(parse_args(["--global-batch-size", "8"]), {"GPU": 4.0})
    assert (gpu.accelerator, gpu.num_workers) == ("gpu", 4)
    assert resolve(parse_args(["--storage-path", "gs://b/p"]), {}).storage_path == "gs://b/p"
    assert Path(resolve(parse_args(["--storage-path", "runs"]), {}).storage_path).is_absolute()


def test_hugging_face_runs_parse() -> None:
    model = ["--model", "Qwen/Qwen2.5-0.5B", "--data", "gs://b/chat/", "--objective", "sft"]
    cfg = parse_args([*model, "--export-max-shard-size", "2GiB", "--no-export"])
    assert (cfg.is_hf, cfg.init_mode, cfg.export) == (True, "pretrained", False)
    assert parse_args(["--model", "park:tiny-llama"]).init_mode == "config"
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("500MB") == 500 * 10**6
    assert data_kind("hf:tatsu-lab/alpaca") == "hf" and data_kind("x/y.npy") == "tokens"
    assert data_kind("park:facts") == "builtin" and data_kind("gs://b/p") == "folder"


def test_export_paths_follow_storage_and_run_name() -> None:
    """The rule serving relies on: gs://BUCKET/<p>/<run>/export/final, /data/<p>/... on GKE."""
    assert (
        training_export_path("gs://b/checkpoints", "dev-park-train")
        == "gs://b/checkpoints/dev-park-train/export/final"
    )
    assert training_export_path("gs://b/x/", "r", step=100) == "gs://b/x/r/export/step_00000100"
    assert training_export_path("gs://b/x", "r", "gs://c/models") == "gs://c/models/final"
    assert training_export_root("gs://b/x", "r") == "gs://b/x/r/export"
    assert Path(training_export_path("~/runs", "r")).is_absolute()


def test_detect_accelerator_prefers_tpu_then_gpu() -> None:
    assert detect_accelerator({"TPU": 4, "GPU": 1, "CPU": 8}) == "tpu"
    assert detect_accelerator({"GPU": 1, "CPU": 8}) == "gpu"
    assert detect_accelerator({"CPU": 8}) == "cpu"


def test_topology_helpers() -> None:
    assert topology_chips("4x4") == topology_chips("4,4,1") == 16
    assert topology_chips("2x2x4") == 16
    assert default_torch_tpu_topology("2x4") == "2,4,1"
    assert default_torch_tpu_topology("2x2x4") == "2,2,4"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_rendered_rayjob_entrypoint_parses(stack: str) -> None:
    """The infra's RayJob entrypoint is a valid invocation of this entrypoint."""
    rayjob = golden_manifests(stack).get("rayjob-park-train.yaml")
    if rayjob is None:
        pytest.skip(f"no rendered RayJob for {stack}")
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "workloads.train"]
    cfg = resolve(parse_args(argv[3:]), {})
    assert cfg.accelerator == "tpu"
    assert cfg.num_workers == topology_chips(str(cfg.tpu_topology)) * cfg.num_slices


_configs = st.builds(
    TrainConfig,
    accelerator=st.sampled_from(["auto", "cpu", "gpu"]),
    strategy=st.sampled_from(["ddp", "fsdp2"]),
    model=st.sampled_from([None, "park:tiny-llama", "Qwen/Qwen3-0.6B", "gs://b/models/x"]),
    model_size=st.sampled_from(["tiny", "gpt2-small"]),
    export=st.booleans(),
    export_max_shard_size=st.sampled_from(["5GB", "100MB"]),
    steps=st.integers(1, 10_000),
    lr=st.floats(1e-6, 1.0),
    compile=st.booleans(),
    activation_checkpointing=st.booleans(),
    micro_batch_size=st.sampled_from([None, 1, 2]),
    run_name=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    storage_path=st.sampled_from(["gs://bucket/runs", "/tmp/runs dir"]),
)


@given(_configs)
def test_entrypoint_round_trips(cfg: TrainConfig) -> None:
    argv = shlex.split(to_entrypoint(cfg))
    assert argv[:3] == ["python", "-m", "workloads.train"]
    assert parse_args(argv[3:]) == cfg
