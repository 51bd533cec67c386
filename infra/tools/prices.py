"""The prices that apply to one stack: `infra/data/prices.yaml`'s row for its region (Google's
list prices, each with its source and date), then the stack's own `park:prices`.

Every figure keeps where it came from, so `park cost` can say which prices it used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra import catalog, datafile
from infra.resolve import StackPlan

PRICES_FILE = Path(__file__).resolve().parents[1] / "data" / "prices.yaml"
OVERRIDE = "park:prices"


@dataclass(frozen=True)
class Price:
    """One figure and where it came from: `park:prices` or a source of prices.yaml."""

    value: float
    source: str  # "park:prices" or a source key of prices.yaml, e.g. "trillium-ga"
    basis: str = ""  # how the figure was derived, if it was
    derived_from: tuple[str, ...] = ()  # further prices.yaml sources the figure relies on


@dataclass(frozen=True)
class PriceSheet:
    """The prices that apply to one stack (its region, its overrides)."""

    region: str
    tpu: dict[str, dict[str, Price]]  # generation -> capacity type -> per chip-hour
    machines: dict[str, Price]  # machine type -> per node-hour
    cluster: Price
    sources: dict[str, dict[str, str]]  # source key -> url, date, says
    override_source: str | None  # park:prices.source, when the stack overrides anything
    region_matched: dict[str, bool] = field(default_factory=dict)  # generation -> own row?

    def chip_hour(self, generation: str, capacity: str) -> Price | None:
        return self.tpu.get(generation, {}).get(capacity)


def tpu_list_prices(
    data: dict[str, Any], region: str
) -> tuple[dict[str, dict[str, Price]], dict[str, bool]]:
    """prices.yaml's TPU rows for `region` (its own row, else "*"): generation -> capacity type
    -> per chip-hour, and whether the region had a row of its own. No stack override."""
    tpu: dict[str, dict[str, Price]] = {}
    matched: dict[str, bool] = {}
    for generation, rows in (data.get("tpu") or {}).items():
        row = rows.get(region) or rows.get("*") or {}
        matched[generation] = region in rows
        basis = row.get("basis") or {}
        derived = row.get("derived_from") or {}
        tpu[generation] = {
            cap: Price(float(v), row["source"], basis.get(cap, ""), tuple(derived.get(cap, ())))
            for cap, v in (row.get("chip_hour") or {}).items()
        }
    return tpu, matched


def load_prices(plan: StackPlan, path: Path = PRICES_FILE) -> PriceSheet:
    """The price sheet for a stack: prices.yaml's row for its region, then `park:prices`."""
    data: dict[str, Any] = datafile.load(path)
    region = plan.spec.region
    tpu, matched = tpu_list_prices(data, region)
    machine_rows = data.get("machines") or {}
    machine_row = machine_rows.get(region) or machine_rows.get("*") or {}
    machines = {
        name: Price(float(v), machine_row["source"])
        for name, v in (machine_row.get("hour") or {}).items()
    }
    cluster = Price(float(data["cluster"]["hour"]), data["cluster"]["source"])

    own = plan.spec.prices
    overridden = bool(own.tpu_chip_hour or own.machine_hour or own.cluster_hour is not None)
    for cap, value in own.tpu_chip_hour.items():
        # every catalog generation, listed in prices.yaml or not (TPU7x has no published price)
        for generation in {*tpu, *catalog.GENERATIONS}:
            tpu.setdefault(generation, {})[cap] = Price(float(value), OVERRIDE)
    for name, value in own.machine_hour.items():
        machines[name] = Price(float(value), OVERRIDE)
    if own.cluster_hour is not None:
        cluster = Price(float(own.cluster_hour), OVERRIDE)
    sources = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in data["sources"].items()}
    return PriceSheet(
        region=region,
        tpu=tpu,
        machines=machines,
        cluster=cluster,
        sources=sources,
        override_source=(own.source or "stack config") if overridden else None,
        region_matched=matched,
    )
