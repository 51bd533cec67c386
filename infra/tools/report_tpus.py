"""`park tpus`: the TPU catalog as users name it (v6e-16, tpu7x-16), one row per slice shape.

Every figure is the catalog's (infra/catalog.py: machine types, topologies, hosts, chips, zones)
or the price sheet's (infra/data/prices.yaml, list prices with their sources); nothing is
derived here but a slice's $/h (chips x $/chip-hour). A table of seven short columns: it fits
80 columns without cutting a name or a price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infra import catalog, datafile
from infra.tools.prices import PRICES_FILE, tpu_list_prices

SHOWN = ("on-demand", "spot")


@dataclass(frozen=True)
class SliceRow:
    """One slice shape: what users call it, and what GKE and the price sheet say of it."""

    accelerator: str  # e.g. v6e-16 (chips) or tpu7x-16 (TensorCores)
    machine_type: str
    topology: str
    hosts: int
    chips: int
    devices: int
    per_hour: dict[str, float]  # capacity type -> $/h for the whole slice (listed ones only)
    zones: tuple[str, ...]


def rows(region: str) -> list[SliceRow]:
    """Every (machine type, topology) of the catalog, priced for `region` where listed."""
    prices, _ = tpu_list_prices(datafile.load(PRICES_FILE), region)
    out = []
    for machine in catalog.MACHINE_TYPES.values():
        generation = catalog.GENERATIONS[machine.generation]
        listed = prices.get(generation.name, {})
        for topology in machine.topologies:
            tpu = catalog.lookup(machine.name, topology)
            units = tpu.chips * generation.pod_type_units_per_chip
            out.append(
                SliceRow(
                    accelerator=f"{generation.name}-{units}",
                    machine_type=machine.name,
                    topology=topology,
                    hosts=tpu.hosts,
                    chips=tpu.chips,
                    devices=tpu.chips * generation.devices_per_chip,
                    per_hour={c: tpu.chips * listed[c].value for c in SHOWN if c in listed},
                    zones=generation.zones,
                )
            )
    return out


def tpus(
    region: Annotated[
        str, typer.Option(help="Price the slices for this region (prices.yaml's rows).")
    ] = "us-east5",
) -> None:
    """The TPU slices park can run, as users name them, with list prices per hour."""
    out = Console(width=None)
    table = Table(
        title=f"TPU slices park knows: list prices in {region}, USD per hour",
        box=None,
        padding=(0, 1),
    )
    for column in ("slice", "machine type", "topology", "hosts", "chips", *SHOWN):
        right = column in ("hosts", "chips", *SHOWN)
        table.add_column(column, justify="right" if right else "left", no_wrap=True)
    for row in rows(region):
        prices = [f"${row.per_hour[c]:,.2f}" if c in row.per_hour else "-" for c in SHOWN]
        table.add_row(
            row.accelerator, row.machine_type, row.topology, str(row.hosts), str(row.chips), *prices
        )
    out.print(table)
    zones = sorted({(r.accelerator.split("-")[0], z) for r in rows(region) for z in r.zones})
    out.print(
        "zones known: " + "; ".join(f"{g} {z}" for g, z in zones) + " (park:extraTpuZones adds). "
        "TPU7x counts TensorCores in its name (tpu7x-8: one 4-chip host) and has no list price.",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """`park tpus`, registered on the CLI (infra/tools/cli.py stays one line longer)."""
    app.command(short_help="The TPU slices park can run, named as users know them, with prices.")(
        tpus
    )
