"""README's generated sections are current, and every config key is documented."""

from __future__ import annotations

from infra.tools import docs
from tests.conftest import render_stack


def test_every_config_key_has_a_description():
    missing = [key for key, _, _, description in docs.config_rows() if not description]
    assert missing == [], f"give these spec fields a docstring (infra/schema): {missing}"


def test_the_config_reference_reads_each_description_from_the_spec_field(monkeypatch):
    """One definition: changing a spec field's docstring changes the README's line."""
    from infra.schema.models import CpuPoolConfig

    field = CpuPoolConfig.model_fields["machine_type"]
    monkeypatch.setattr(field, "description", "Changed in one place.")
    rows = {key: text for key, _, _, text in docs.config_rows()}
    assert rows["park:cpuPool.machineType"] == "Changed in one place."


def test_readme_generated_blocks_are_current():
    text = docs.README.read_text()
    assert docs.render_readme(text, render_stack) == text, (
        "README is stale: run `python -m infra.tools.docs`"
    )


def test_readme_gives_the_two_fresh_machine_commands():
    text = docs.README.read_text()
    assert "bash scripts/install.sh && .venv/bin/park local dev" in text
    assert ".venv/bin/pytest" in text
