"""The deploy path is an order a person can follow, in README's "Deploy" section and the docs'
Deploying for real page (docs/deploy.md): every command they name exists (the park CLI's verbs,
the config keys it sets, the objects kubectl reaches), in the order the program creates them."""

from __future__ import annotations

import re
import shlex

from infra.schema.keys import config_keys
from infra.tools.cli import app
from tests.conftest import ROOT, render_stack

SECTION = re.compile(r"^## Deploy\n(.*?)^## ", re.S | re.M)


TOOLS = ("park", "pulumi", "kubectl", "gcloud", "pip", "curl")


def _section() -> str:
    """README's Deploy section, then the whole of docs/deploy.md."""
    found = SECTION.search((ROOT / "README.md").read_text())
    assert found, "README has no 'Deploy' section"
    return found.group(1) + "\n" + (ROOT / "docs" / "deploy.md").read_text()


def _commands() -> list[list[str]]:
    """Each command of the section: its fenced blocks' lines (continuations joined, comments
    dropped) and its inline code that starts with a tool, split at `&&` and `|`."""
    text = _section()
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += [c for c in re.findall(r"`([^`\n]+)`", text) if c.split(" ", 1)[0] in TOOLS]
    commands = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"&&|\|", line):
            words = shlex.split(part, posix=True)
            if words and words[0] in TOOLS:
                commands.append(words)
    return commands


def test_the_park_verbs_it_names_exist():
    verbs = {c.name or c.callback.__name__ for c in app.registered_commands}
    named = {w[1] for w in _commands() if w[0] == "park" and len(w) > 1}
    assert named and named <= verbs, named - verbs


def test_the_config_keys_it_sets_exist():
    keys = set(config_keys())
    named = []
    for words in _commands():
        if words[:3] == ["pulumi", "config", "set"]:
            rest = [w for w in words[3:] if not w.startswith("--")]
            named += rest[:1]  # a prose mention names no key
    assert "gcp:project" in named and "park:hfToken" in named
    for key in named:
        top = key.split(".", 1)[0]
        assert top in keys, f"the deploy path sets {key}, which the program does not read"
        if top == "park:training":
            from pydantic.alias_generators import to_snake

            from infra.schema.jobs import TrainingConfig

            assert to_snake(key.split(".", 1)[1]) in TrainingConfig.model_fields


def test_the_objects_kubectl_reaches_exist_in_the_dev_render():
    rendered = render_stack("dev")
    services = {
        r.inputs["spec"]["serveService"]["metadata"]["name"]
        for r in rendered.of_type("kubernetes:ray.io/v1:RayService")
    }
    namespace = rendered.plan.names.namespace
    for words in _commands():
        if words[:1] != ["kubectl"]:
            continue
        assert words[words.index("-n") + 1] == namespace
        for word in words:
            if word.startswith("svc/"):
                assert word[4:] in services
    (served,) = [m.spec.name for m in rendered.plan.serving.models]
    assert f'"model": "{served}"' in _section()
