"""The entrypoint's flags, config file, validation and resolution (no cluster, no torch)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from workloads.train.__main__ import main
from workloads.train.config import (
    ConfigError,
    TrainConfig,
    default_torch_tpu_topology,
    detect_accelerator,
    parse_args,
    resolve,
    to_entrypoint,
    topology_chips,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

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
    "--seq-len",
    "--lr",
    "--warmup-steps",
    "--checkpoint-every",
    "--storage-path",
    "--run-name",
    "--max-failures",
    "--data",
    "--report-every",
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
        (["--data", "corpus.parquet"], "expected 'synthetic'"),
        (["--run-name", "a/b"], "--run-name"),
    ],
)
def test_invalid_combinations_say_which_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


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
    path = GOLDEN / stack / "manifests" / "rayjob-park-train.yaml"
    if not path.exists():
        pytest.skip(f"no rendered RayJob for {stack}")
    argv = shlex.split(yaml.safe_load(path.read_text())["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "workloads.train"]
    cfg = resolve(parse_args(argv[3:]), {})
    assert cfg.accelerator == "tpu"
    assert cfg.num_workers == topology_chips(str(cfg.tpu_topology)) * cfg.num_slices


_configs = st.builds(
    TrainConfig,
    accelerator=st.sampled_from(["auto", "cpu", "gpu"]),
    strategy=st.sampled_from(["ddp", "fsdp2"]),
    model_size=st.sampled_from(["tiny", "gpt2-small"]),
    steps=st.integers(1, 10_000),
    lr=st.floats(1e-6, 1.0),
    compile=st.booleans(),
    run_name=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    storage_path=st.sampled_from(["gs://bucket/runs", "/tmp/runs dir"]),
)


@given(_configs)
def test_entrypoint_round_trips(cfg: TrainConfig) -> None:
    argv = shlex.split(to_entrypoint(cfg))
    assert argv[:3] == ["python", "-m", "workloads.train"]
    assert parse_args(argv[3:]) == cfg
