"""Names from the component: every child's logical name derives from its component's name, and
every object a component creates is claimed, so that two components aiming at the same object
are refused at preview instead of silently writing it in turn.

The shipped stack program (infra.program) predates derived names: it builds its components
inside `stack_program()`, and each child whose derived name differs from the name it was
deployed under takes that old name as a Pulumi alias, so deployed stacks keep their resources.
Outside that block no alias is given: two instances aliasing one old name is itself an engine
error ("Duplicate resource alias"). The block also carries the program's resolved StackPlan:
components built inside plan from their piece of it (infra.components._base.checked_plan)
instead of resolving their arguments again, and do not repeat its warnings.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pulumi

if TYPE_CHECKING:
    from infra.resolve import StackPlan

# While the stack program builds its components: its plan (None: names only, as in a test of
# the aliases). A stack, innermost last, so that the block nests and always unwinds.
_PROGRAM: list[StackPlan | None] = []


@contextlib.contextmanager
def stack_program(plan: StackPlan | None = None) -> Iterator[None]:
    """Components built inside are the stack program's: their children keep the logical names
    it deployed them under (aliases), they plan from `plan` (resolved and checked once, for
    the whole stack), and the plan's warnings are not said twice."""
    _PROGRAM.append(plan)
    try:
        yield
    finally:
        _PROGRAM.pop()


def in_stack_program() -> bool:
    return bool(_PROGRAM)


def program_plan() -> StackPlan | None:
    """The stack program's resolved plan, while it builds its components; else None."""
    return _PROGRAM[-1] if _PROGRAM else None


def child_name(component: str, role: str) -> str:
    """A child's logical name: ``<component>-<role>``."""
    return f"{component}-{role}"


def renamed(opts: pulumi.ResourceOptions, name: str, legacy: str | None) -> pulumi.ResourceOptions:
    """`opts`, with the child's old logical name as an alias when the stack program builds it
    (stack_program) and the name changed."""
    if not _PROGRAM or legacy is None or legacy == name:
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
