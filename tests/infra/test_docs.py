"""README's generated sections are current, and every config key is documented."""

from __future__ import annotations

from infra.tools import docs
from tests.conftest import render_stack


def test_every_config_key_has_a_description():
    missing = [key for key, _, _, description in docs.config_rows() if not description]
    assert missing == [], f"add a line to infra/tools/docs.py DESCRIPTIONS for: {missing}"


def test_readme_generated_blocks_are_current():
    text = docs.README.read_text()
    assert docs.render_readme(text, render_stack) == text, (
        "README is stale: run `python -m infra.tools.docs`"
    )


def test_readme_gives_the_two_fresh_machine_commands():
    text = docs.README.read_text()
    assert "bash scripts/install.sh && .venv/bin/park local dev" in text
    assert ".venv/bin/pytest" in text
