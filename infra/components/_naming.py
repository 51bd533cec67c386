"""Names from the component: every child's logical name derives from its component's name, and
every object a component creates is claimed, so that two components aiming at the same object
are refused at preview instead of silently writing it in turn.

The shipped stack program (infra.program) predates derived names: it builds its components from
its plan (`Component.of_plan` constructors), and each child of such a component whose derived
name differs from the name it was deployed under takes that old name as a Pulumi alias, so
deployed stacks keep their resources. A component built from a user's arguments gives no alias:
two instances aliasing one old name is itself an engine error ("Duplicate resource alias").
"""

from __future__ import annotations

import weakref
from typing import Any

import pulumi


def child_name(component: str, role: str) -> str:
    """A child's logical name: ``<component>-<role>``."""
    return f"{component}-{role}"


def renamed(opts: pulumi.ResourceOptions, name: str, legacy: str | None) -> pulumi.ResourceOptions:
    """`opts`, with the child's old logical name `legacy` as an alias when it is given (a
    component of the stack program: Component.legacy) and differs from `name`."""
    if legacy is None or legacy == name:
        return opts
    return pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(name=legacy)])
    )


# ---- claims: one owner per object ------------------------------------------------------------

# Per program run (the root Stack resource), what each object is claimed by.
_CLAIMS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], str]] = weakref.WeakKeyDictionary()
_NO_ROOT: dict[tuple[Any, ...], str] = {}


def _claims() -> dict[tuple[Any, ...], str]:
    from pulumi.runtime.settings import get_root_resource

    root = get_root_resource()
    if root is None:  # a provider's construct call: one component per call
        _NO_ROOT.clear()
        return _NO_ROOT
    return _CLAIMS.setdefault(root, {})


# ---- the TPU pools a program declares ----------------------------------------------------------

_POOLS: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()
_Expected = list[tuple[str, str, dict[str, Any]]]  # (owner, argument, pool reference)
_CLUSTER_POOLS: weakref.WeakKeyDictionary[Any, _Expected] = weakref.WeakKeyDictionary()
_NO_ROOT_POOLS: dict[str, dict[str, Any]] = {}
_NO_ROOT_CLUSTERS: _Expected = []


def _root() -> Any:
    from pulumi.runtime.settings import get_root_resource

    return get_root_resource()


def declare_pool(ref: dict[str, Any]) -> None:
    """A TpuSlicePool of this program: what a workload's hand-written pool reference is
    checked against (pool_ref_problems)."""
    root = _root()
    pools = _POOLS.setdefault(root, {}) if root is not None else _NO_ROOT_POOLS
    pools[str(ref["name"])] = dict(ref)


def declared_pools() -> dict[str, dict[str, Any]]:
    root = _root()
    return dict(_POOLS.get(root, {})) if root is not None else dict(_NO_ROOT_POOLS)


def expect_cluster_pool(owner: str, field: str, ref: dict[str, Any]) -> None:
    """A workload's pool that no TpuSlicePool of the program declares: the existing cluster
    must have it, which its lookup tells at preview (ExistingCluster: cluster_pool_problems)."""
    root = _root()
    expected = _CLUSTER_POOLS.setdefault(root, []) if root is not None else _NO_ROOT_CLUSTERS
    expected.append((owner, field, dict(ref)))


def cluster_pool_problems(pools: list[tuple[str, str]]) -> list[str]:
    """The expected pools (expect_cluster_pool) an existing cluster's `park-gke/pool` node
    pools (label, machine type) do not hold, each in its workload's words."""
    root = _root()
    expected = _CLUSTER_POOLS.get(root, []) if root is not None else _NO_ROOT_CLUSTERS
    return [
        f"{owner}: {wrong}"
        for owner, field, ref in expected
        if (wrong := existing_pool_problem(field, ref, [pools]))
    ]


_REF_DEFAULTS = {"slices": 1, "capacity": "on-demand", "reservation": None, "ladder": None}


def pool_ref_problems(field: str, ref: dict[str, Any]) -> list[str]:
    """A pool reference written by hand, against the TpuSlicePools this program declared
    before it (a typo would leave the pods Pending for ever). [] when the program declares
    none: the pools are an existing cluster's (checked at preview: existing_pool_problem)."""
    declared = declared_pools()
    if not declared:
        return []
    name = ref.get("name")
    same = declared.get(str(name))
    if same is None:
        return [
            f"args.{field}.name = {name!r}: no TpuSlicePool of this program is named so "
            f"(declared: {', '.join(sorted(declared))}); give the pool itself, or its pool_ref"
        ]
    return [
        f"args.{field}.{key} = {ref.get(key, default)!r}: TpuSlicePool {name!r} has "
        f"{same.get(key, default)!r}"
        for key, default in {"machine_type": None, "topology": None, **_REF_DEFAULTS}.items()
        if ref.get(key, default) != same.get(key, default)
    ]


def existing_pool_problem(field: str, ref: dict[str, Any], pools: list[Any]) -> str | None:
    """A pool reference against the node pools of the program's existing cluster(s), as
    their lookup answered: one must carry park-gke/pool=<name> on the machine type."""
    name, machine = ref.get("name"), ref.get("machine_type")
    found = {label: kind for answer in pools for label, kind in answer}
    if found.get(name) == machine:
        return None
    have = ", ".join(f"{k} ({v})" for k, v in sorted(found.items())) or "none"
    return (
        f"args.{field}.name = {name!r}: the cluster has no node pool labelled "
        f"park-gke/pool={name} of {machine} (its park-gke pools: {have}); the pods would stay "
        "Pending"
    )


def cluster_key(parent: pulumi.Resource, opts: pulumi.ResourceOptions | None) -> object:
    """Which cluster a component's Kubernetes objects go to: its own provider (kubeconfig),
    else the one in its options, else the default provider (None)."""
    own = getattr(parent, "kubernetes_provider", None)
    if own is not None:
        return id(own)
    providers: Any = opts.providers if opts else None
    if isinstance(providers, dict):
        given = providers.get("kubernetes")
    elif isinstance(providers, list):
        given = next((p for p in providers if getattr(p, "package", None) == "kubernetes"), None)
    else:
        given = getattr(opts, "provider", None) if opts else None
    return id(given) if given is not None else None


def claim(owner: str, what: str, key: tuple[Any, ...]) -> str | None:
    """Record that `owner` (``LlmService 'a'``) creates `what` (``RayService park/park-serve``);
    the problem to refuse it with when another component already does."""
    claims = _claims()
    held = claims.get((what, *key))
    if held is not None and held != owner:
        return f"{what} is already {held}'s: give this one another name"
    claims[(what, *key)] = owner
    return None


def kubernetes_claims(
    owner: str,
    parent: pulumi.Resource,
    opts: pulumi.ResourceOptions | None,
    manifests: list[dict[str, Any]],
) -> list[str]:
    """Claim each manifest's object in its cluster; the problems for those already claimed."""
    cluster = cluster_key(parent, opts)
    problems = []
    for manifest in manifests:
        meta = manifest.get("metadata", {})
        namespace = meta.get("namespace")
        where = f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
        problem = claim(owner, f"{manifest['kind']} {where}", (cluster,))
        if problem:
            problems.append(problem)
    return problems
