"""What every public component shares: its arguments checked with the stack's own rules.

Two ways in, one build. The public edge (`Component(name, args, opts)`, what `park_gke` and the
provider call) builds the part of a stack spec its arguments describe (a pool, a training
job...), runs it once through the pipeline every stack takes (infra.stack: types, every rule,
resolve) and takes its piece of the result. So it is held to the same catalog and rules as a
stack file, and its errors name the component, the argument and what is allowed. The stack
program (infra.program) resolved and checked the whole stack once: it hands each component its
typed piece of that plan through the component's `of_plan` constructor, which checks nothing
again. Both end in the component's own build from the piece. `Component` is the base every
component class derives from: registration, argument checks, planning, refusals and outputs.
"""

import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, Self, TypeVar

import pulumi

from infra.names import StackNames, stack_names
from infra.resolve import StackPlan
from infra.schema.errors import ConfigError
from infra.schema.safe import shown
from infra.schema.secrets import redact

TYPE_PREFIX = "park-gke:index:"  # the package's type tokens (PulumiPlugin name "park-gke")


def use_kubeconfig(component: pulumi.ComponentResource, name: str, args: Mapping[str, Any]) -> None:
    """With args.kubeconfig, the component's children talk to that cluster (child_options).

    Every in-cluster component's args declare `kubeconfig` themselves: Pulumi's schema analyzer
    reads a field's description only from the class that declares it."""
    if args.get("kubeconfig") is None:
        return
    from pulumi_kubernetes import Provider

    # Server-side apply: KubeRay's CRDs are too large for client-side apply's annotation.
    component.kubernetes_provider = Provider(  # type: ignore[attr-defined]
        f"{name}-kubernetes",
        kubeconfig=args["kubeconfig"],
        enable_server_side_apply=True,
        opts=pulumi.ResourceOptions(parent=component),
    )


class ComponentArgsError(pulumi.RunError, ValueError):
    """A component's arguments that no stack could deploy, each named by its field. A
    pulumi.RunError: under `pulumi preview` it reads as one error, not a Python traceback."""

    def __init__(self, component: str, name: str, problems: list[str]):
        self.component, self.name, self.problems = component, name, problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{component} {name!r}: invalid arguments:\n{lines}")


def bad_value(field: str, value: Any, message: str) -> str:
    """One refused argument, as ComponentArgsError lists it (never a value that may be a
    credential)."""
    return f"args.{field} = {shown(redact(value))}: {message}"


def stack_of(args: Mapping[str, Any]) -> str:
    """The stack names derive from: the argument, else the Pulumi stack being deployed (what
    every other component of the program defaults to as well)."""
    return str(args.get("stack") or pulumi.get_stack())


def namespace_names(args: Mapping[str, Any]) -> StackNames:
    """The names of a component whose objects live in the workloads' namespace: from its
    `project`, `stack` (stack_of), `namespace` (default park) and `bucket` (default the
    stack's); no region, cluster or registry."""
    return stack_names(
        project=args["project"],
        region="-",
        stack=stack_of(args),
        cluster=None,
        namespace=args.get("namespace") or "park",
        bucket=args.get("bucket"),
        registry_repository=None,
    )


def checked_args(component: str, name: str, args: Any, typed: Any) -> dict[str, Any]:
    """`args` checked against the component's TypedDict (infra.components._checks): unknown keys
    with the nearest known one, missing ones, wrong shapes, Outputs where a value must be known.
    Components handed in an argument's place stand for what they hand on."""
    from infra.components._checks import handed_on, mapping_problems

    if not isinstance(args, Mapping):
        raise ComponentArgsError(
            component, name, [f"args must be a mapping of arguments, got {type(args).__name__}"]
        )
    given = handed_on(args)
    problems = mapping_problems(given, typed)
    if problems:
        raise ComponentArgsError(component, name, problems)
    return given


def stack_values(args: Mapping[str, Any], *fields: str) -> dict[str, Any]:
    """The public edge's arguments among `fields` that are set, under their stack-file
    (camelCase) keys: the part of a stack they describe, for checked_plan."""
    from pydantic.alias_generators import to_camel

    return {to_camel(f): args[f] for f in fields if args.get(f) is not None}


def checked_plan(
    component: str,
    name: str,
    values: dict[str, Any],
    fields: Iterable[tuple[str, str]],
    *,
    stack: str,
    rules: bool = True,
    derived: Iterable[str] = (),
) -> StackPlan:
    """The StackPlan of the stack-config `values` a component's arguments make, or a
    ComponentArgsError whose problems name the argument (`fields`: (config-key prefix,
    argument prefix) pairs, longest first) instead of the stack key. `rules` False: types only,
    for a component that plans a part of a stack whose other parts it does not know.
    `derived`: arguments the caller left out that default to the component's name: a refusal
    of one says so, and that setting the argument is the way out.

    Only the public edge calls it: the stack program hands its components their pieces of the
    plan it resolved (`of_plan`), so every plan is resolved once."""
    from infra.resolve import resolve
    from infra.schema.read import parse_values
    from infra.stack import from_values

    # gcp:project and gcp:region are every component's `project` and `region` where it has them
    prefixes = sorted([*fields, ("gcp:", "")], key=lambda pair: -len(pair[0]))

    def argument(key: str) -> str | None:
        for prefix, arg in prefixes:
            if key.startswith(prefix):
                return _snake_path(arg + key[len(prefix) :])
        return None

    def in_args(match: re.Match[str]) -> str:
        found = argument(match.group(0))
        return match.group(0) if found is None else f"args.{found}"

    def told(problem: Any) -> str:
        """A problem in the component's argument names, its message's stack keys too; never a
        stack-file key the caller did not write (names derived from the stack: `args.stack`)."""
        message = _STACK_KEY.sub(in_args, problem.message)
        field = argument(problem.key) or ("stack" if problem.key == "stack" else None)
        if field is None:
            return f"args: {message}"
        if field in derived:
            message += derived_hint(field, name)
        return f"args.{field} = {shown(redact(problem.value))}: {message}"

    try:
        if not rules:
            plan = resolve(parse_values(values, stack), partial=True)
        else:
            # Exposure is judged on the component's own arguments only (its part of a stack):
            # infra.components._posture.
            from infra.components._posture import with_posture

            plan = with_posture(from_values(values, stack, posture=False), argument)
    except ConfigError as err:
        raise ComponentArgsError(component, name, [told(p) for p in err.problems]) from None
    for warning in plan.warnings:
        # e.g. an unknown model whose memory fit cannot be checked: said, not dropped (the
        # stack program says its plan's warnings itself). Only those about the component's
        # own arguments: the rest of the stack it stands for is not the caller's.
        if argument(warning.key) is not None:
            pulumi.log.warn(f"{component} {name!r}: {told(warning)}")
    return plan


def derived_hint(field: str, name: str) -> str:
    """What a refusal of an argument the caller left out adds: where its value came from."""
    return f" (args.{field} defaults to the component's name {name!r}: set args.{field})"


_STACK_KEY = re.compile(r"(?:park|gcp):[A-Za-z0-9_.\[\]]*[A-Za-z0-9_\]]")


def _snake_path(path: str) -> str:
    """``models[0].tensorParallelSize`` → ``models[0].tensor_parallel_size``."""
    out = []
    for char in path:
        if char.isupper():
            out.append("_" + char.lower())
        else:
            out.append(char)
    return "".join(out).lstrip(".")


# The stack a component plans a part of when no stack-derived name of its own comes from it
# (a pool, Kueue): any valid name, so that names it never creates cannot refuse it.
PART_STACK = "part"


def name_problems(args: Mapping[str, Any], checks: Mapping[str, Any]) -> list[str]:
    """Arguments that name Kubernetes or GCP objects, each by its grammar (infra.rules.grammar):
    `checks` maps an argument to its check; an unset one or an Output is not checked here."""
    found = []
    for field, check in checks.items():
        value = args.get(field)
        if isinstance(value, str) and (wrong := check(value)):
            found.append(bad_value(field, value, f"not {wrong.removeprefix('not ')}"))
    return found


def region_of(zone: str) -> str:
    """``us-east5-b`` → ``us-east5``."""
    return zone.rsplit("-", 1)[0]


def site_values(project: str, zone: str) -> dict[str, str]:
    """Where the one-component stack a component plans stands: its project, zone and the
    zone's region (a regional component stands in a zone of its region it never uses)."""
    return {"gcp:project": project, "gcp:region": region_of(zone), "park:zone": zone}


def child_options(
    parent: pulumi.Resource,
    opts: pulumi.ResourceOptions | None,
    *,
    depends_on: list[pulumi.Resource] | None = None,
) -> pulumi.ResourceOptions:
    """Options for a component's children: parented, and waiting for what the component was
    told to wait for (a component's depends_on does not reach its children by itself)."""
    given: Any = opts.depends_on if opts else None
    if given is None:
        given = []
    elif isinstance(given, pulumi.Resource):
        given = [given]
    waits = [*given, *(depends_on or [])]
    provider = getattr(parent, "kubernetes_provider", None)  # use_kubeconfig's
    return pulumi.ResourceOptions(
        parent=parent,
        depends_on=waits or None,
        providers={"kubernetes": provider} if provider is not None else None,
    )


def checked_model(component: str, name: str, model: Any, values: dict[str, Any]) -> Any:
    """A spec model (infra.schema.models) from a component's arguments, or a ComponentArgsError
    naming each argument pydantic refused."""
    from pydantic import ValidationError

    try:
        return model.model_validate(values)
    except ValidationError as err:
        problems = [
            f"args.{_snake_path('.'.join(str(p) for p in e['loc']))} = "
            f"{shown(redact(e.get('input')))}: {e['msg']}"
            for e in err.errors()
        ]
        raise ComponentArgsError(component, name, problems) from None


_Args = TypeVar("_Args")


class Component(pulumi.ComponentResource):
    """What every public component does first and last, so that its own code is what it plans.

    First (`__init__`, then `checked`): register as ``park-gke:index:<its class>`` and check the
    arguments against their TypedDict. Last (`register`): its outputs, the attributes its
    class and its bases annotate (what the provider schema publishes). In between, `plan`
    (checked_plan), `child_options` and `refuse` speak for the component: refusals name it and
    its argument.
    The stack program's components are made by `planned` instead (their `of_plan`): no
    arguments to check, and their children keep the names they were deployed under (`legacy`).
    No class-level annotations here: the schema analyzer would publish them as outputs.
    """

    def __init__(
        self, name: str, opts: pulumi.ResourceOptions | None, *, of_plan: bool = False
    ) -> None:
        self._component = type(self).__name__
        self._component_name = name
        self._component_opts = opts
        self._of_plan = of_plan
        super().__init__(TYPE_PREFIX + self._component, name, None, opts)

    @classmethod
    def planned(cls, name: str, opts: pulumi.ResourceOptions | None) -> Self:
        """An instance registered for an `of_plan` constructor: its build comes next."""
        self = cls.__new__(cls)
        Component.__init__(self, name, opts, of_plan=True)
        return self

    def legacy(self, name: str) -> str | None:
        """A child's old logical name, as an alias (infra.components._naming.renamed): kept
        for the stack program's components only."""
        return name if self._of_plan else None

    def checked(self, args: _Args, typed: type) -> _Args:
        """`args` checked strictly (checked_args), a component handed in an argument's place
        taken as what it hands on."""
        given: Any = checked_args(self._component, self._component_name, args, typed)
        return given

    def plan(
        self, values: dict[str, Any], fields: Iterable[tuple[str, str]], **options: Any
    ) -> StackPlan:
        """The StackPlan the component's arguments make (checked_plan: `stack`, and `rules`
        and `derived` as it takes them), its piece taken next."""
        return checked_plan(self._component, self._component_name, values, fields, **options)

    def child_options(
        self, *, depends_on: list[pulumi.Resource] | None = None
    ) -> pulumi.ResourceOptions:
        """Options for a child: parented here, waiting for what the component waits for."""
        return child_options(self, self._component_opts, depends_on=depends_on)

    @property
    def owner(self) -> str:
        """How claims name it: ``Network 'network'``."""
        return f"{self._component} {self._component_name!r}"

    def refuse(self, problems: list[str]) -> NoReturn:
        raise ComponentArgsError(self._component, self._component_name, problems)

    def kuberay_install(self, args: Mapping[str, Any]) -> str:
        """`kuberay_install` (default addon), refused unless the stack key allows it (its one
        declaration: KubeRayConfig.install)."""
        from infra.components._types import literal_values
        from infra.schema.models import KubeRayConfig

        install: str = args.get("kuberay_install", "addon")
        allowed = literal_values(KubeRayConfig, "install")
        if install not in allowed:
            self.refuse([bad_value("kuberay_install", install, f"allowed: {', '.join(allowed)}")])
        return install

    def refuse_taken(self, field: str, value: Any, taken: Iterable[str | None]) -> None:
        """Refuse, naming `field` = `value`, the objects another component already holds
        (`taken`: infra.components._naming.claim's answers, None where the claim held)."""
        problems = [f"args.{field} = {value!r}: {t}" for t in taken if t]
        if problems:
            self.refuse(problems)

    def register(self, **more: Any) -> None:
        """Register the outputs: each attribute the class and its bases annotate, and `more`."""
        outputs = {key: getattr(self, key) for key in output_names(type(self))}
        self.register_outputs({**outputs, **more})


def output_names(component: type) -> list[str]:
    """The outputs a component class publishes: the attributes it and its bases annotate (as
    Pulumi's analyzer reads them: a base such as ClusterComponent declares the outputs its
    classes share), the bases' first."""
    names: dict[str, None] = {}
    for cls in reversed(component.__mro__):
        if issubclass(cls, Component):
            names.update(dict.fromkeys(inspect.get_annotations(cls)))
    return [name for name in names if not name.startswith("_")]


class KubernetesComponent(Component):
    """A component whose children are Kubernetes objects: given `kubeconfig`, they use a
    provider of the component's own (use_kubeconfig), else the one in its options."""

    def checked(self, args: _Args, typed: type) -> _Args:
        given = super().checked(args, typed)
        use_kubeconfig(self, self._component_name, given)
        return given

    def claim_objects(self, manifests: list[dict[str, Any]]) -> list[str]:
        """Each manifest's object checked (check_objects) and claimed in the component's
        cluster; the problems for those another component holds (infra.components._naming.
        kubernetes_claims)."""
        from infra.components._naming import kubernetes_claims

        self.check_objects(manifests)
        return kubernetes_claims(self.owner, self, self._component_opts, manifests)

    def check_objects(self, manifests: list[dict[str, Any]]) -> None:
        """Refuse, at preview, an object whose name, namespace or labels Kubernetes would
        refuse at `pulumi up` (after GCP resources may exist): the last word, behind the
        checks of the arguments they come from."""
        from infra.rules.grammar import object_problems

        found = [
            p for m in manifests if m.get("kind") != "Helm release" for p in object_problems(m)
        ]
        if found:
            self.refuse(found)
