"""`park local`'s pure parts: the CPU profile of the RayJob entrypoint, progress parsing.

The whole run (Ray, training, vLLM) is tests/e2e/test_park_local.py.
"""

from __future__ import annotations

import shlex

import pytest

from infra.tools.local.console import metrics_line
from infra.tools.local.profile import (
    TRAIN_CPU_PROFILE,
    ProfileError,
    cpu_entrypoint,
    runtime_env_of,
    staged_profile,
)
from tests.conftest import SHIPPED_STACKS, render_stack
from workloads.protocol import flag, parse_line, split_entrypoint
from workloads.train.config_check import parse_args


def _rayjob(stack: str) -> dict:
    return next(m for m in render_stack(stack).manifests() if m["kind"] == "RayJob")


def _flags(entrypoint: str) -> dict[str, str | None]:
    """--flag → value (None for a bare boolean flag), read with the workloads' own splitter."""
    _, fields = split_entrypoint(entrypoint)
    return {flag(field): value for field, value in fields.items()}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_cpu_profile_applies_to_every_shipped_rayjob(stack):
    rendered = _rayjob(stack)["spec"]["entrypoint"]
    if rendered.startswith("python -m workloads.rl "):
        pytest.skip("an RL job: its CPU profile is tests/infra/test_cli_local_rl.py's")
    entrypoint, changes = cpu_entrypoint(rendered)
    assert entrypoint.startswith("python -m workloads.train ")
    flags = _flags(entrypoint)
    for field, (value, _why) in TRAIN_CPU_PROFILE.items():
        if value is None:
            assert flag(field) not in flags
        else:
            assert flags[flag(field)] == value.format(storage="/tmp/run/checkpoints")
    # everything the profile does not name is kept as rendered
    profiled = {flag(f) for f in TRAIN_CPU_PROFILE}
    for name, value in _flags(rendered).items():
        if name not in profiled:
            assert flags[name] == value
    # and the workload's own parser accepts the result
    assert parse_args(shlex.split(entrypoint)[3:]).accelerator == "cpu"
    # every change is said, with its reason
    assert any(c.startswith("--accelerator tpu -> cpu (") for c in changes)
    assert any(c.startswith("--tpu-topology ") and "dropped" in c for c in changes)
    # whatever the stack trains, the local run trains the tiny Llama on the facts and exports
    assert flags["--model"] == "park:tiny-llama" and flags["--data"] == "park:facts"
    assert "--no-export" not in flags


def test_a_staged_model_is_the_local_bucket_folder_and_the_trainer_waits_for_it():
    """dev trains a hub model from its staged copy: locally that copy is the run's bucket
    folder (staged from a local hub), and the rendered wait stays (the trainer waits)."""
    rendered = _rayjob("dev")["spec"]["entrypoint"]
    local = "/tmp/run/bucket/models/Qwen/Qwen3-1.7B"
    entrypoint, changes = cpu_entrypoint(rendered, staged_profile(local, "Qwen/Qwen3-1.7B"))
    flags, before = _flags(entrypoint), _flags(rendered)
    assert before["--model"] == "/data/models/Qwen/Qwen3-1.7B"
    assert flags["--model"] == local
    assert flags["--model-wait-s"] == before["--model-wait-s"] and int(flags["--model-wait-s"])
    assert flags["--init"] == "config"  # the tiny Llama's config, random weights
    assert parse_args(shlex.split(entrypoint)[3:]).model_wait_s > 0
    assert any(c.startswith("--model /data/models/Qwen/Qwen3-1.7B -> /tmp/run/") for c in changes)


def test_values_with_spaces_survive():
    entrypoint, _ = cpu_entrypoint(
        "python -m workloads.train --text-field 'the text' --storage-path 'gs://b/a b' --steps 9"
    )
    flags = _flags(entrypoint)
    assert flags["--text-field"] == "the text"
    assert flags["--storage-path"] == "gs://b/a b"  # kept: the run writes to the emulated bucket


def test_other_entrypoints_are_refused():
    with pytest.raises(ProfileError, match=r"does not run workloads\.train"):
        cpu_entrypoint("python train.py --steps 3")


def test_runtime_env_passes_unchanged():
    rayjob = _rayjob("dev")
    env = runtime_env_of(rayjob)
    assert isinstance(env, dict) and "env_vars" in env


def test_progress_lines_behind_rays_prefix():
    line = '\x1b[36m(RayTrainWorker pid=1)\x1b[0m PARK_METRICS {"step": 5, "loss": 5.5}'
    assert parse_line(line) == ("PARK_METRICS", {"step": 5, "loss": 5.5})
    assert parse_line('PARK_RESULT {"final_step": 30}') == ("PARK_RESULT", {"final_step": 30})
    assert parse_line("PARK_METRICS {not json") is None
    assert parse_line("(pid=3) INFO starting") is None


def test_metrics_line_reads_well():
    line = metrics_line(
        {"step": 10, "loss": 5.4563, "tokens_per_s": 2059.1, "tokens_per_s_per_worker": 1029.5},
        30,
    )
    assert line == "step 10/30  loss 5.4563  tokens/s 2,059.1 (1,029.5/worker)"  # no MFU on CPU


def test_the_served_folder_gets_the_model_checks_validate_runs(tmp_path):
    import io
    import json

    from rich.console import Console

    from infra.tools.local.answers import check_local_model
    from infra.tools.local.ray_head import LocalRunError

    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
    }
    quiet = Console(file=io.StringIO())
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_local_model(str(tmp_path), quiet)  # servable
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["Nope"]}))
    with pytest.raises(LocalRunError, match="architecture Nope is not one vLLM"):
        check_local_model(str(tmp_path), quiet)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(LocalRunError, match=r"config\.json"):
        check_local_model(str(tmp_path), quiet)


def test_the_local_heads_settings_are_rays_own():
    """Each name the local head sets is read by Ray 2.60 (a typo would be silently ignored)."""
    from pathlib import Path

    import ray

    from infra.tools.local.ray_head import LOCAL_RAY_ENV, PRIVATE_PORT_ENV

    root = Path(ray.__file__).parent
    sources = "".join(
        (root / p).read_text()
        for p in (
            "_private/ray_constants.py",
            "serve/_private/constants.py",
            "train/v2/_internal/constants.py",
            "_raylet.pyx",
        )
        if (root / p).exists()
    )
    sources += "".join(p.read_text(errors="ignore") for p in (root / "dashboard").glob("*.py"))
    for name in (*LOCAL_RAY_ENV, *PRIVATE_PORT_ENV):
        assert name in sources or name.startswith("RAY_agent_"), name
