"""Security rules of a stack: its exposure (posture). Values checked as what they are, and the
counts GKE allows, are in infra/rules/values.py.

Posture is decided here once, for both gates: `park validate` / `pulumi preview` run these
rules on the spec, and the policy pack (policy/security.py) calls `posture_verdict` on the
resources it sees, with the same production marker and acknowledgements. On a production stack
(park:policy.prodLike, default: a prod* stack name; or deletion protection set explicitly), a
control plane open to the internet, public nodes and a public serving endpoint are refused
unless park:policy.acknowledgePublic names them; elsewhere they are warnings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from infra.schema.errors import ConfigProblem
from infra.schema.models import ClusterConfig, PolicyConfig, StackConfig

Exposure = Literal["control-plane", "nodes", "serving"]
EXPOSURES: tuple[Exposure, ...] = ("control-plane", "nodes", "serving")


@dataclass(frozen=True)
class Verdict:
    refused: bool
    message: str


def production(spec: StackConfig) -> bool:
    """A stack held to production posture: marked prod-like, or asking for deletion
    protection itself (the default does not count: it is a safety default, not a statement)."""
    return production_of(spec.policy, spec.cluster, spec.stack)


def production_of(policy: PolicyConfig, cluster: ClusterConfig, stack: str) -> bool:
    """`production` from the two sections it reads (the policy pack has no whole spec)."""
    explicit = "deletion_protection" in cluster.model_fields_set
    return policy.is_prod_like(stack) or (explicit and cluster.deletion_protection)


def posture_verdict(
    exposure: Exposure, what: str, *, production: bool, acknowledged: frozenset[str]
) -> Verdict:
    """Refused on production unless acknowledged; a warning elsewhere (and when acknowledged)."""
    ack = f"park:policy.acknowledgePublic: [{exposure}]"
    if production and exposure not in acknowledged:
        return Verdict(
            True,
            f"{what}, on a production stack; close it, or say it is meant with {ack}",
        )
    if exposure in acknowledged:
        return Verdict(False, f"{what} (acknowledged by park:policy.acknowledgePublic)")
    return Verdict(False, f"{what}; a production stack would refuse it unless {ack}")


def exposures(spec: StackConfig) -> Iterator[tuple[Exposure, str, str]]:
    """(exposure, config key, what is open) of a spec. A range of everyone (0.0.0.0/0) is
    held to production posture on every stack (the policy pack always refused it)."""
    cluster = spec.cluster
    networks = cluster.master_authorized_networks
    cidrs = [n.cidr for n in networks]  # an invalid CIDR is check_ranges' problem
    if open_to_everyone(cidrs):
        everyone = [i for i, c in enumerate(cidrs) if _prefix(c) == 0]
        alone = bool(everyone)
        yield (
            "control-plane",
            f"park:cluster.masterAuthorizedNetworks[{everyone[0]}].cidr"
            if alone
            else "park:cluster.masterAuthorizedNetworks",
            "opens the control plane to the whole internet"
            if alone
            else "together open the control plane to half the internet or more "
            f"({_covered(cidrs)} of the IPv4 address space)",
        )
    elif not networks and not cluster.private_endpoint:
        yield (
            "control-plane",
            "park:cluster.masterAuthorizedNetworks",
            "empty without park:cluster.privateEndpoint: the control plane's public IP "
            "accepts connections from the whole internet",
        )
    if not cluster.private_nodes:
        yield "nodes", "park:cluster.privateNodes", "nodes get public IP addresses"
    if spec.serving.enabled and spec.serving.expose_publicly:
        yield (
            "serving",
            "park:serving.exposePublicly",
            "the OpenAI endpoint gets a public load balancer, unauthenticated",
        )


# Authorized ranges are judged together: two /1 halves are 0.0.0.0/0. Half the IPv4 address
# space or more (a /1, or ranges adding up to one) is the whole internet for a control plane.
EVERYONE_SHARE = 0.5


def _union(cidrs: list[str]) -> list[ipaddress.IPv4Network]:
    ranges = []
    for cidr in cidrs:
        try:
            ranges.append(ipaddress.IPv4Network(cidr, strict=False))
        except ValueError:
            continue
    return list(ipaddress.collapse_addresses(ranges))


def _covered(cidrs: list[str]) -> str:
    share = sum(n.num_addresses for n in _union(cidrs)) / 2**32
    return f"{share:.0%}"


def open_to_everyone(cidrs: list[str]) -> bool:
    """Whether authorized ranges together cover EVERYONE_SHARE of IPv4 or more (the policy
    pack asks the same of the rendered cluster)."""
    if any(c.strip() == "::/0" for c in cidrs):
        return True
    return sum(n.num_addresses for n in _union(cidrs)) >= EVERYONE_SHARE * 2**32


def _prefix(cidr: str) -> int | None:
    try:
        return ipaddress.ip_network(cidr, strict=False).prefixlen
    except ValueError:
        return None


def check_posture(spec: StackConfig) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(problems, warnings) of the stack's exposure."""
    problems: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    acknowledged = frozenset(spec.policy.acknowledge_public)
    prod = production(spec)
    for exposure, key, what in exposures(spec):
        strict = prod or (
            exposure == "control-plane"
            and open_to_everyone([n.cidr for n in spec.cluster.master_authorized_networks])
        )
        verdict = posture_verdict(exposure, what, production=strict, acknowledged=acknowledged)
        value = _value_at(spec, key)
        (problems if verdict.refused else warnings).append(
            ConfigProblem(key, value, verdict.message)
        )
    return problems, warnings


def _value_at(spec: StackConfig, key: str) -> object:
    if key.endswith(".cidr"):
        index = int(key.split("[")[1].split("]")[0])
        return spec.cluster.master_authorized_networks[index].cidr
    return {
        "park:cluster.masterAuthorizedNetworks": [
            n.cidr for n in spec.cluster.master_authorized_networks
        ],
        "park:cluster.privateNodes": spec.cluster.private_nodes,
        "park:serving.exposePublicly": spec.serving.expose_publicly,
    }.get(key)


def policy_warnings(spec: StackConfig) -> list[ConfigProblem]:
    """A production stack that turns a rule of the policy pack off (disabled) or down
    (advisory: reported, never blocking): valid, and said, so that it is a decision."""
    if not production(spec):
        return []
    what = {
        "disabled": "the policy pack will not check it",
        "advisory": "the policy pack reports it but no longer blocks `pulumi up`",
    }
    return [
        ConfigProblem(
            f"park:policy.enforcement.{rule}",
            level,
            f"{level} on a production stack: {what[level]}; keep it mandatory unless this "
            "stack must differ",
        )
        for rule, level in spec.policy.enforcement.items()
        if level in what
    ]
