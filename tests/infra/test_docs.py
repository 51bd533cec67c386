"""The generated sections of docs/ and README are current, and every config key is documented."""

from __future__ import annotations

from infra.tools import docs
from tests.conftest import render_stack


def test_every_config_key_has_a_description():
    missing = [key for key, _, _, description in docs.config_rows() if not description]
    assert missing == [], f"give these spec fields a docstring (infra/schema): {missing}"


def test_the_config_reference_reads_each_description_from_the_spec_field(monkeypatch):
    """One definition: changing a spec field's docstring changes the config reference's line."""
    from infra.schema.models import CpuPoolConfig

    field = CpuPoolConfig.model_fields["machine_type"]
    monkeypatch.setattr(field, "description", "Changed in one place.")
    rows = {key: text for key, _, _, text in docs.config_rows()}
    assert rows["park:cpuPool.machineType"] == "Changed in one place."


def test_generated_blocks_are_current():
    """Every generated table and flowchart of docs/ and README is what the code makes now."""
    stale = [
        str(page.relative_to(docs.ROOT))
        for page, (now, rewritten) in docs.render_pages(render_stack).items()
        if rewritten != now
    ]
    assert stale == [], f"{stale} are stale: run `make docs` (python -m infra.tools.docs)"


def test_a_page_without_its_block_is_refused():
    import pytest

    with pytest.raises(ValueError, match="no cost block"):
        docs.replace_block("# Cost\n", "cost", "| table |")


def test_readme_gives_the_two_fresh_machine_commands():
    text = docs.README.read_text()
    assert "bash scripts/install.sh && .venv/bin/park local dev" in text
    assert ".venv/bin/pytest" in text
