"""The deploy role of each resource type holds the permissions `pulumi up` and `pulumi destroy`
use on it, by the roles' published contents (infra/data/compute_roles.yaml, vendored with its
source and date): a TPU7x workload policy (compute ResourcePolicy) needs
compute.resourcePolicies.*, which roles/compute.networkAdmin does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import datafile
from infra.tools.roles import roles_of_type
from tests.conftest import render_stack

DATA = Path(__file__).resolve().parents[2] / "infra" / "data" / "compute_roles.yaml"
RESOURCE_POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"


def _data() -> dict:
    data: dict = datafile.load(DATA)
    return data


def _granted(roles: tuple[str, ...]) -> set[str]:
    contents = _data()["roles"]
    missing = [r for r in roles if r.startswith("roles/compute.") and r not in contents]
    assert not missing, f"vendor the contents of {missing} in {DATA.name}"
    return {p for r in roles for p in contents.get(r) or []}


def test_the_data_names_its_source_and_date():
    data = _data()
    assert data["source"].startswith("https://cloud.google.com/")
    assert data["read"]


@pytest.mark.parametrize("type_token", sorted(_data()["needs"]))
def test_each_type_maps_to_roles_that_hold_what_it_needs(type_token):
    needed = set(_data()["needs"][type_token])
    held = _granted(roles_of_type(type_token))
    assert needed <= held, f"{type_token}: {sorted(needed - held)} not held by its roles"


def test_network_admin_would_not_do():
    """What the mapping was: gcp:compute/ → roles/compute.networkAdmin."""
    needed = set(_data()["needs"][RESOURCE_POLICY])
    assert not needed & _granted(("roles/compute.networkAdmin",))


def test_the_ironwood_stack_creates_one_and_its_role_is_listed():
    from infra.tools.roles import deploy_roles

    rendered = render_stack("ironwood")
    types = {r.type for r in rendered.resources}
    assert RESOURCE_POLICY in types
    assert "roles/compute.instanceAdmin.v1" in deploy_roles(types)
