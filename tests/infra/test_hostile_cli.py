"""Hostile input through the `park` CLI, in-process (issue 20): `--out` owns only what it wrote
(7), `park validate --manifests` runs the credential and posture checks without echoing values
(8), messages are bounded (6), and a property test plants credential-shaped strings in every
string-typed key of a stack: none reaches stdout, stderr or a file under --out, in clear,
base64 or URL-encoded."""

from __future__ import annotations

import base64
import json
import os
import string
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from typer.testing import CliRunner

from infra.schema.models import StackConfig
from infra.tools.cli import app
from tests.conftest import STACKS_DIR

# The `park` CLI end to end under hostile input: the e2e tier, which keeps the fast tier under
# 3 minutes.
pytestmark = pytest.mark.e2e

runner = CliRunner()


def park(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def dev_stack(tmp_path: Path) -> Path:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    return path


# ---- 7. --out owns only what it wrote ----------------------------------------------------------


def test_out_never_touches_files_it_did_not_write(tmp_path):
    out = tmp_path / "out"
    (out / "manifests").mkdir(parents=True)
    mine = out / "manifests" / "notes.yaml"
    mine.write_text("my: notes\n")
    stack = dev_stack(tmp_path)
    assert park("render", "dev", "--config-file", str(stack), "--out", str(out)).exit_code == 0
    assert mine.read_text() == "my: notes\n"  # not deleted: park did not write it
    written = json.loads((out / ".park-render.json").read_text())["files"]
    assert "resources.json" in written and "manifests/notes.yaml" not in written
    # A second render replaces its own files; one changed by hand is refused, never overwritten.
    assert park("render", "dev", "--config-file", str(stack), "--out", str(out)).exit_code == 0
    edited = out / "resources.json"
    edited.write_text("[]\n")
    result = park("render", "dev", "--config-file", str(stack), "--out", str(out))
    assert result.exit_code == 2 and "resources.json" in result.output
    assert edited.read_text() == "[]\n"
    assert "Traceback" not in result.output


def test_out_does_not_overwrite_a_file_with_a_rendered_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "resources.json").write_text("precious\n")
    result = park("render", "dev", "--config-file", str(dev_stack(tmp_path)), "--out", str(out))
    assert result.exit_code == 2 and (out / "resources.json").read_text() == "precious\n"


@pytest.mark.parametrize("what", ["a file", "unwritable"])
def test_a_bad_out_is_a_one_line_error(tmp_path, what):
    if what == "a file":
        out = tmp_path / "out"
        out.write_text("x")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "out"
    result = park("render", "dev", "--config-file", str(dev_stack(tmp_path)), "--out", str(out))
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--out" in errors[0] and "Traceback" not in result.output


# ---- 8. park validate --manifests on hand-edited manifests --------------------------------------

HF = "hf_" + "Xy7Pq2Lm9Nv4Rt6Ws8Kd3Jf5Hg1Zb0Ca"


@pytest.fixture(scope="module")
def rendered_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rendered")
    out = tmp / "out"
    assert (
        park("render", "dev", "--config-file", str(dev_stack(tmp)), "--out", str(out)).exit_code
        == 0
    )
    return out / "manifests"


def _edit(src: Path, dst: Path, change) -> Path:
    dst.mkdir()
    for path in src.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "RayJob":
            change(doc)
        (dst / path.name).write_text(yaml.safe_dump(doc))
    return dst


def _env(doc: dict, name: str, value: Any) -> None:
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head.setdefault("env", []).append({"name": name, "value": value})


def _validate(manifests: Path):
    stack = STACKS_DIR / "Pulumi.dev.yaml"
    return park(
        "validate",
        "dev",
        "--config-file",
        str(stack),
        "--manifests",
        str(manifests),
        "--no-serve-check",
    )


def test_validate_manifests_refuses_credentials_without_echoing_them(rendered_dir, tmp_path):
    result = _validate(_edit(rendered_dir, tmp_path / "m1", lambda d: _env(d, "HF_TOKEN", HF)))
    assert result.exit_code == 1
    assert "security" in result.output and "literal HF_TOKEN" in result.output
    assert HF not in result.output and HF[3:20] not in result.output
    in_command = _edit(
        rendered_dir,
        tmp_path / "m2",
        lambda d: d["spec"].update(entrypoint=d["spec"]["entrypoint"] + f" --token {HF}"),
    )
    result = _validate(in_command)
    assert result.exit_code == 1 and "Hugging Face token" in result.output
    assert HF not in result.output


def test_validate_manifests_passes_a_harmless_edit(rendered_dir, tmp_path):
    result = _validate(
        _edit(rendered_dir, tmp_path / "ok", lambda d: _env(d, "LOG_LEVEL", "debug"))
    )
    assert result.exit_code == 0, result.output


def test_schema_errors_do_not_echo_the_value(rendered_dir, tmp_path):
    marker = "Zq9" * 40 + "\x1b[2J"

    def bad(doc: dict) -> None:
        doc["spec"]["shutdownAfterJobFinishes"] = marker

    result = _validate(_edit(rendered_dir, tmp_path / "m3", bad))
    assert result.exit_code == 1 and "shutdownAfterJobFinishes" in result.output
    assert "Zq9Zq9Zq9" not in result.output and "\x1b" not in result.output


def test_an_alias_bomb_in_a_manifests_folder_is_one_line(tmp_path):
    folder = tmp_path / "bomb"
    folder.mkdir()
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (folder / "x.yaml").write_text("\n".join(lines) + "\n")
    result = _validate(folder)
    assert result.exit_code == 1 and "alias" in result.output and "Traceback" not in result.output


# ---- 6. messages are bounded --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("  park:cluster:\n    name: " + "a" * 2_000_000 + "\n", "park:cluster.name"),
        ('  park:namespace: "bad\\e[31mname"\n', "park:namespace"),
        ('  park:prices:\n    source: "rates \\u202egnp.exe"\n', "park:prices.source"),
    ],
)
def test_a_huge_value_and_control_characters_are_not_printed_back(tmp_path, line, key):
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(
        "config:\n  gcp:project: p\n  gcp:region: us-east5\n  park:zone: us-east5-b\n" + line
    )
    result = park("validate", "x", "--config-file", str(stack), "--no-serve-check")
    assert result.exit_code == 1 and key in result.output
    assert len(result.output) < 20_000
    assert "\x1b[31m" not in result.output and "\u202e" not in result.output


# ---- the property: planted credentials never come out -------------------------------------------


def _string_paths(model: type[BaseModel], prefix: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every string-typed key of the spec, as a path into a stack's config."""
    paths = []
    for name, field in model.model_fields.items():
        here = (*prefix, to_camel(name))
        kinds = get_args(field.annotation) or (field.annotation,)
        for kind in kinds:
            origin = get_origin(kind)
            if kind is str or origin is Literal:
                paths.append(here)
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                paths += _string_paths(kind, here)
            elif origin is list:
                (item,) = get_args(kind)
                if isinstance(item, type) and issubclass(item, BaseModel):
                    paths += _string_paths(item, (*here, 0))
                else:
                    paths.append((*here, 0))
            elif origin is dict:
                paths.append((*here, "planted"))
    return sorted(set(paths), key=str)


def _top(path: tuple[Any, ...]) -> tuple[Any, ...]:
    head, *rest = path
    key = {"project": "gcp:project", "region": "gcp:region"}.get(head, f"park:{head}")
    return (key, *rest)


PATHS = [_top(p) for p in _string_paths(StackConfig, ()) if p[0] not in ("stack", "hfToken")]
CORE = st.text(string.ascii_letters + string.digits, min_size=36, max_size=40)
SHAPES = [
    lambda c: f"hf_{c}",
    lambda c: f"AIza{c[:35]}",
    lambda c: f"GOCSPX-{c}",
    lambda c: f"ya29.{c}",
    lambda c: f"-----BEGIN PRIVATE KEY-----\n{c}\n-----END PRIVATE KEY-----",
    lambda c: json.dumps({"type": "service_account", "private_key": c}),
    lambda c: f"https://user:{c}@example.com/model",
    lambda c: f"https://example.com/data.jsonl?token={c}",
    lambda c: f"gs://bucket/x?X-Goog-Signature={c}",
]


def _plant(config: dict, path: tuple[Any, ...], value: str) -> None:
    node: Any = config
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            node = node[part]
            continue
        if path[i + 1] == 0:
            of_dicts = i + 2 < len(path)
            current = node.get(part)
            if (
                not isinstance(current, list)
                or not current
                or (of_dicts and not isinstance(current[0], dict))
            ):
                node[part] = [{}] if of_dicts else [""]
        elif not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(PATHS), shape=st.sampled_from(SHAPES), core=CORE)
def test_planted_credentials_never_come_out(tmp_path_factory, path, shape, core):
    tmp = tmp_path_factory.mktemp("plant")
    config = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())["config"]
    credential = shape(core)
    _plant(config, path, credential)
    stack = tmp / "Pulumi.dev.yaml"
    stack.write_text(yaml.safe_dump({"config": config}))
    out = tmp / "out"
    outputs = []
    for args in (
        ("render", "dev", "--config-file", str(stack), "--out", str(out)),
        ("validate", "dev", "--config-file", str(stack), "--no-serve-check"),
        ("cost", "dev", "--config-file", str(stack)),
    ):
        result = runner.invoke(app, list(args))
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            path,
            result.exception,
        )
        outputs.append(result.output)
        if args[0] == "validate":  # refused, naming the key the credential was planted in
            assert result.exit_code == 1 and str(path[0]) in result.output, path
    outputs += [p.read_text() for p in out.rglob("*") if p.is_file()] if out.exists() else []
    forms = {
        core,
        base64.b64encode(credential.encode()).decode(),
        base64.urlsafe_b64encode(credential.encode()).decode(),
        quote(credential, safe=""),
    }
    for text in outputs:
        for form in forms:
            assert form not in text, (path, shape(""))
