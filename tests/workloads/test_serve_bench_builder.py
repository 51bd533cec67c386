"""benchmarks/serve_overhead.py's choice of app builder for its Ray sides (issue 39, "One hop
fewer"): ours (workloads/serve/app.py, what the RayService renders) or Ray's build_openai_app,
on the same args; the ``ray_openai_app`` side is Ray's in every run, so one run compares them."""

from __future__ import annotations

import pytest

from benchmarks.serve import cli, gpu, servers

OURS = "workloads.serve.app:build_app"
RAYS = "ray.serve.llm:build_openai_app"
AS_SHIPPED = ("ray_serve_llm", "ray_replica_direct", "ray_nice0")


def _import_paths(variant: servers.Variant) -> set[str]:
    assert variant.config is not None
    return {a["import_path"] for a in variant.config["applications"]}


@pytest.mark.parametrize(("flag", "expected"), [([], OURS), (["--builder", "ray"], RAYS)])
def test_builder_flag_picks_the_as_shipped_sides_builder(flag: list[str], expected: str) -> None:
    args = cli.parse(flag)
    known = servers.variants({}, args.builder)
    for side in AS_SHIPPED:
        assert _import_paths(known[side]) == {expected}, side
    assert _import_paths(known[servers.RAYS_APP]) == {RAYS}
    assert _import_paths(known["ray_defaults"]) == {RAYS}
    # the same args and env either way: only the builder differs
    assert known[servers.RAYS_APP].env == known["ray_serve_llm"].env
    rays_args = [a["args"] for a in known[servers.RAYS_APP].config["applications"]]  # type: ignore[index]
    ours_args = [a["args"] for a in known["ray_serve_llm"].config["applications"]]  # type: ignore[index]
    assert rays_args == ours_args


def test_the_gpu_run_has_rays_builder_as_a_side_too() -> None:
    known = gpu.variants(servers.rendered_serve_config(), "/models/qwen3-8b", {})
    assert _import_paths(known["ray_serve_llm"]) == {OURS}
    assert _import_paths(known[servers.RAYS_APP]) == {RAYS}
    assert cli.sides_of(cli.parse(["--sides", f"vllm,ray_serve_llm,{servers.RAYS_APP}"])) == [
        "vllm",
        "ray_serve_llm",
        servers.RAYS_APP,
        "vllm_check",
    ]
