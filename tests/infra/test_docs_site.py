"""The docs site builds with `mkdocs build --strict`: a broken link, a missing page or a page left
out of mkdocs.yml's nav fails it. README stays a front page that links into the site."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT


@pytest.mark.e2e
def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "stacks" / "index.html").exists()
    assert 'class="mermaid"' in (tmp_path / "stacks" / "index.html").read_text()


def test_the_nav_holds_the_reference_pages():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = {next(iter(entry.values())) for entry in config["nav"]}
    needed = {"config.md", "stacks.md", "components.md", "training.md", "serving.md", "rl.md"}
    needed |= {"observability.md", "security.md", "development.md"}
    assert needed <= pages, needed - pages
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == on_disk, pages ^ on_disk


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 300, len(lines)
    top = "\n".join(lines[:40])
    assert "Where it stands" in top and "not yet" in top.lower(), "a status statement first"
    assert "pulumi destroy" in text
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)\)", text))
    assert {"deploy.md", "config.md", "stacks.md", "changelog.md"} <= linked
    for page in linked:
        assert (ROOT / "docs" / page).is_file(), page
