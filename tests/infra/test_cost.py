"""`park cost` against figures computed by hand from infra/data/prices.yaml.

Hand arithmetic (list prices, USD): v6e on-demand 2.70, spot 1.08 (2.70 less 60%), reservation
1.89 (1-year), flex-start / queued 1.269 (2.70 less 53%) per chip-hour; e2-standard-8 0.268024
and e2-standard-16 0.536048 per node-hour; cluster fee 0.10 per hour. If a shipped stack changes,
these figures must be recomputed by hand, not copied from the output.
"""

from __future__ import annotations

import pytest

from infra.stack import from_file, from_values
from infra.tools.cost import estimate, load_prices
from tests.conftest import STACKS_DIR

BASE = {"gcp:project": "p", "gcp:region": "us-east5", "park:zone": "us-east5-b"}


def stack_cost(stack: str):
    path = STACKS_DIR / f"Pulumi.{stack}.yaml"
    if not path.exists():
        pytest.skip(f"stack {stack} is not shipped")
    return estimate(from_file(path, stack))


def pools(cost) -> dict:
    return {p.name: p for p in cost.pools}


def test_dev_by_hand():
    cost = stack_cost("dev")
    p = pools(cost)
    # two single-host 2x4 slices (ct6e-standard-8t: 8 chips, 1 host each), spot
    for name in ("v6e-8", "serve-v6e-8"):
        assert (p[name].slices, p[name].hosts, p[name].chips) == (1, 1, 8)
        assert p[name].chip_hours_per_hour == 8
        assert p[name].by_capacity == pytest.approx(
            {"on-demand": 21.60, "spot": 8.64, "reservation": 15.12, "flex-start": 10.152}
        )
        assert p[name].full_per_hour == pytest.approx(8.64)
        assert p[name].idle_per_hour == 0  # autoscaled to 0 nodes
    # CPU pool: e2-standard-8, 1..3 nodes
    assert p["cpu"].full_per_hour == pytest.approx(3 * 0.268024)
    assert p["cpu"].idle_per_hour == pytest.approx(0.268024)
    assert cost.full_per_hour == pytest.approx(0.10 + 0.804072 + 8.64 + 8.64)  # 18.184072
    assert cost.idle_per_hour == pytest.approx(0.10 + 0.268024)  # 0.368024
    # serving keeps one spot slice up for minReplicas 1
    assert cost.serving_floor_per_hour == pytest.approx(0.368024 + 8.64)
    run = cost.training_run
    # 500 steps x 1 s = 0.1389 h on 8 chips = 1.111 chip-hours x 1.08
    assert run.hours == pytest.approx(500 / 3600)
    assert run.chips == 8
    assert run.chip_hours == pytest.approx(8 * 500 / 3600)
    assert run.cost == pytest.approx(1.20)


def test_prod_by_hand():
    cost = stack_cost("prod")
    p = pools(cost)
    train, serve = p["train-v6e-16"], p["serve-v6e-16"]
    # 4x4 on ct6e-standard-4t: 16 chips on 4 hosts per slice
    assert (train.slices, train.hosts, train.chips) == (1, 4, 16)
    assert (serve.slices, serve.hosts, serve.chips) == (2, 8, 32)
    assert train.full_per_hour == pytest.approx(16 * 1.89)  # reservation: 30.24
    assert train.idle_per_hour == pytest.approx(30.24)  # billed whether used or not
    assert serve.full_per_hour == pytest.approx(32 * 2.70)  # on-demand: 86.40
    assert serve.by_capacity["spot"] == pytest.approx(32 * 1.08)
    assert serve.idle_per_hour == 0
    assert p["cpu"].full_per_hour == pytest.approx(4 * 0.536048)
    assert cost.full_per_hour == pytest.approx(0.10 + 2.144192 + 30.24 + 86.40)  # 118.884192
    assert cost.idle_per_hour == pytest.approx(0.10 + 0.536048 + 30.24)  # 30.876048
    assert cost.serving_floor_per_hour == pytest.approx(30.876048 + 43.20)  # one 4x4 slice
    run = cost.training_run
    # 4,000 steps x 1 s = 1.111 h on 16 chips = 17.8 chip-hours x 1.89
    assert run.chip_hours == pytest.approx(16 * 4000 / 3600)
    assert run.cost == pytest.approx(33.60)


def test_queued_by_hand():
    cost = stack_cost("queued")
    p = pools(cost)
    train = p["train-v6e-16"]
    assert (train.slices, train.hosts, train.chips) == (2, 8, 32)
    assert train.full_per_hour == pytest.approx(32 * 1.269)  # queued = DWS price: 40.608
    assert train.idle_per_hour == 0
    assert cost.idle_per_hour == pytest.approx(0.368024)
    assert cost.training_run.cost == pytest.approx(16 * 5000 / 3600 * 1.269)  # one slice: 28.20


def stack(**values) -> object:
    return from_values(
        {
            **BASE,
            "park:tpuPools": [
                {"name": "t", "machineType": "ct6e-standard-4t", "topology": "2x2", **values}
            ],
        },
        "x",
    )


def test_stack_prices_override_list_prices_and_are_named():
    config = from_values(
        {
            **BASE,
            "park:tpuPools": [{"name": "t", "machineType": "ct6e-standard-4t", "topology": "2x2"}],
            "park:prices": {
                "source": "contract 2026-10",
                "tpuChipHour": {"on-demand": 2.0},
                "clusterHour": 0,
            },
        },
        "x",
    )
    cost = estimate(config)
    assert pools(cost)["t"].full_per_hour == pytest.approx(4 * 2.0)
    assert pools(cost)["t"].by_capacity["spot"] == pytest.approx(4 * 1.08)  # not overridden
    assert cost.cluster_per_hour == 0
    data = cost.as_json()
    assert data["prices"]["override"] == "contract 2026-10"
    assert "park:prices" in data["prices"]["sources_used"]
    assert "trillium-ga" in data["prices"]["sources_used"]  # spot etc. still from the file


def test_region_without_its_own_row_is_flagged():
    config = from_values({**BASE, "gcp:region": "europe-west4", "park:zone": "europe-west4-a"}, "x")
    assert load_prices(config).region_matched == {"v6e": False}
    assert load_prices(stack()).region_matched == {"v6e": True}


def test_pool_without_autoscaling_costs_while_idle():
    cost = estimate(stack(autoscaling=False))
    assert pools(cost)["t"].idle_per_hour == pytest.approx(4 * 2.70)
    assert "stay up" in pools(cost)["t"].idle_why


def test_flex_start_and_spot_prices():
    assert pools(estimate(stack(capacity="spot")))["t"].full_per_hour == pytest.approx(4 * 1.08)
    flex = pools(estimate(stack(capacity="flex-start")))["t"]
    assert flex.full_per_hour == pytest.approx(4 * 1.269)
    assert flex.idle_per_hour == 0


def test_unpriced_machine_type_is_reported_not_guessed():
    config = from_values({**BASE, "park:cpuPool": {"machineType": "n2-standard-8"}}, "x")
    cost = estimate(config)
    assert cost.full_per_hour is None
    assert any("n2-standard-8" in m and "park:prices.machineHour" in m for m in cost.missing)
