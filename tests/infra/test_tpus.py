"""`park tpus`: the catalog as users name the slices, priced from prices.yaml, in 80 columns."""

from __future__ import annotations

import re

import yaml
from typer.testing import CliRunner

from infra import catalog
from infra.tools.cli import app
from infra.tools.prices import PRICES_FILE
from infra.tools.report_tpus import rows


def test_every_catalog_shape_is_listed_within_80_columns():
    result = CliRunner().invoke(app, ["tpus"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for machine in catalog.MACHINE_TYPES.values():
        for topology in machine.topologies:
            line = next(
                (
                    line
                    for line in result.output.splitlines()
                    if machine.name in line.split() and topology in line.split()
                ),
                None,
            )
            assert line is not None, (machine.name, topology)
    assert "…" not in result.output  # nothing cut


def test_names_and_prices_are_the_ones_users_and_google_use():
    """v6e names count chips (v6e-16: a 4x4 of 4 hosts), TPU7x names TensorCores (tpu7x-8 is one
    4-chip host: FACTS.md); a slice's price is its chips at prices.yaml's listed chip-hour."""
    listed = yaml.safe_load(PRICES_FILE.read_text())["tpu"]["v6e"]["us-east5"]["chip_hour"]
    by_shape = {(r.machine_type, r.topology): r for r in rows("us-east5")}
    v6e16 = by_shape[("ct6e-standard-4t", "4x4")]
    assert (v6e16.accelerator, v6e16.hosts, v6e16.chips) == ("v6e-16", 4, 16)
    assert v6e16.per_hour["on-demand"] == 16 * listed["on-demand"]
    assert v6e16.per_hour["spot"] == 16 * listed["spot"]
    ironwood = by_shape[("tpu7x-standard-4t", "2x2x1")]
    assert (ironwood.accelerator, ironwood.chips, ironwood.devices) == ("tpu7x-8", 4, 8)
    assert ironwood.per_hour == {}  # no published TPU7x price
    result = CliRunner().invoke(app, ["tpus"], env={"COLUMNS": "80"})
    assert re.search(r"v6e-16\s+ct6e-standard-4t\s+4x4\s+4\s+16\s+\$43\.20", result.output)
