"""Run the Pulumi program offline under `pulumi.runtime.set_mocks` and record what it declares.

No CLI, no provider plugins, no credentials: the SDK's mock monitor receives every resource
registration; we keep its type, name, parent and inputs (secrets masked). This is how
`park render` works and how the tests see the resource graph.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra import stack as stack_front
from infra.resolve import StackPlan
from infra.schema.models import SECRET_PLACEHOLDER, StackConfig
from infra.tools.flowchart import flowchart
from infra.tools.outdir import RECORD as RECORD
from infra.tools.outdir import OutputError as OutputError
from infra.tools.outdir import write_owned
from infra.tools.placement import placement_chart

PROJECT = "park-gke"
_SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
_SIG_KEY = "4dabf18193072939515e22adb298388d"
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


@dataclass
class Resource:
    type: str
    name: str
    parent: str | None
    inputs: dict[str, Any]
    custom: bool
    dependencies: list[str] = field(default_factory=list)  # names this one waits for
    provider: str | None = None  # the explicit provider it is created with (a waits-for too)
    # (type, name) of each resource it waits for, the provider included: logical names alone
    # repeat across types (the GKE cluster, its component and the Kubernetes provider).
    waits: list[tuple[str, str]] = field(default_factory=list)
    ignore_changes: list[str] = field(default_factory=list)  # inputs a second `up` ignores

    def as_json(self) -> dict[str, Any]:
        """Its record in resources.json: what it is, its inputs, and what waits for what
        (`dependsOn`: explicit and from inputs; `provider`; `parent`), by logical name, and the
        inputs a later `up` leaves as they are (`ignoreChanges`, only where there are some)."""
        record: dict[str, Any] = {
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "dependsOn": sorted(set(self.dependencies)),
        }
        if self.provider:
            record["provider"] = self.provider
        if self.ignore_changes:
            record["ignoreChanges"] = sorted(self.ignore_changes)
        record["inputs"] = self.inputs
        return record


@dataclass
class Rendered:
    plan: StackPlan
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> StackConfig:
        """The stack spec the render came from."""
        return self.plan.spec

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str, name: str) -> Resource:
        matches = [r for r in self.of_type(type_token) if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources of {type_token} named {name}")
        return matches[0]

    def manifests(self) -> list[dict[str, Any]]:
        """Every Kubernetes object, as the API server would receive it."""
        return manifests_of(self.resources)


def manifests_of(resources: list[Resource]) -> list[dict[str, Any]]:
    """The Kubernetes objects among registered resources (Helm releases aside)."""
    return [
        _manifest_of(r)
        for r in resources
        if r.type.startswith("kubernetes:")
        and not r.type.startswith(("kubernetes:helm", "pulumi:providers"))
    ]


# ---------------------------------------------------------------------------------------------
# Mock run


def _mask_leaves(value: Any) -> Any:
    """A secret keeps its shape (keys, list lengths) but never its values."""
    if isinstance(value, dict):
        return {k: _mask_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_leaves(v) for v in value]
    return SECRET_PLACEHOLDER


def _clean(value: Any) -> Any:
    """Mask secrets and unknowns; numbers come back as floats from the wire, integers stay ints."""
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return _mask_leaves(value.get("value"))
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value == _UNKNOWN:
        return "[unknown]"
    return value


def _mask_outputs(exported: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """Stack outputs with secret ones (e.g. the kubeconfig) masked."""
    from pulumi.runtime.sync_await import _sync_await

    masked = {}
    for key, value in resolved.items():
        output = exported[key]
        is_secret = hasattr(output, "is_secret") and _sync_await(output.is_secret())
        masked[key] = SECRET_PLACEHOLDER if is_secret else _clean(value)
    return masked


def _mock_outputs(type_token: str, name: str, inputs: dict[str, Any], project: str) -> dict:
    """Plausible outputs for the few resources whose outputs others read."""
    outputs = dict(inputs)
    outputs.setdefault("name", name)
    if type_token == "gcp:container/cluster:Cluster":
        outputs["endpoint"] = "203.0.113.10"
        if "controlPlaneEndpointsConfig" in inputs:
            dns = {**inputs["controlPlaneEndpointsConfig"].get("dnsEndpointConfig", {})}
            dns["endpoint"] = "gke-0123456789abcdef.us-east5.gke.goog"
            outputs["controlPlaneEndpointsConfig"] = {"dnsEndpointConfig": dns}
        outputs["masterAuth"] = {"clusterCaCertificate": "LS0tLS1CRUdJTi1NT0NLLUNBLS0tLS0="}
    if type_token == "gcp:serviceaccount/account:Account":
        email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
        outputs["email"] = email
        outputs["name"] = f"projects/{project}/serviceAccounts/{email}"
    if type_token == "docker-build:index:Image" and inputs.get("tags"):
        # What the provider answers after a push: the tag with the pushed manifest's digest
        # (here a stand-in derived from the tag, so that renders are stable).
        import hashlib

        tag = inputs["tags"][0]
        outputs["ref"] = f"{tag}@sha256:{hashlib.sha256(tag.encode()).hexdigest()}"
        outputs["digest"] = outputs["ref"].split("@", 1)[1]
    return outputs


def _mock_call(token: str, project: str) -> dict[str, Any]:
    """Answers to the invokes the stack program makes itself."""
    if token == "gcp:organizations/getClientConfig:getClientConfig":
        # The deployer's token (secret in the program, never written by a render).
        return {"accessToken": "mock-access-token", "project": project, "region": "", "zone": ""}
    return {}


def _typed(urn: str) -> tuple[str, str]:
    """(type, name) of a URN: ``urn:pulumi:stack::project::parent$type::name``."""
    parts = urn.split("::")
    return parts[2].split("$")[-1], parts[-1]


def _provider_name(reference: str) -> str | None:
    """An explicit provider's logical name from its reference (``<urn>::<id>``); None for
    the default provider of a package."""
    if not reference:
        return None
    urn = reference.rsplit("::", 1)[0]
    name = urn.split("::")[-1]
    return None if name.startswith("default") else name


class ProgramError(RuntimeError):
    """The program failed under mocks; `resources` holds what it registered before failing."""

    def __init__(self, message: str, resources: list[Resource]):
        super().__init__(message)
        self.resources = resources


Calls = Callable[[str, dict[str, Any]], dict[str, Any]]


async def _drain(rpc_manager: Any) -> None:
    """Let a failed program's remaining RPCs and outputs settle (their errors are its error),
    so that none of them fails the next program run in this process."""
    import asyncio
    import contextlib

    from pulumi.runtime.settings import SETTINGS

    while rpc_manager.rpcs:
        with contextlib.suppress(Exception):
            await rpc_manager.rpcs.pop()
    with SETTINGS.lock:
        pending = list(SETTINGS.outputs)
        SETTINGS.outputs.clear()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=10)
        for task in stuck:
            task.cancel()
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" at exit
    rpc_manager.clear()


def run_under_mocks(
    program: Callable[[], None],
    *,
    stack: str,
    project: str = "project",
    config: dict[str, Any] | None = None,
    secret_keys: list[str] | None = None,
    calls: Calls | None = None,
    pulumi_project: str = PROJECT,
) -> tuple[list[Resource], dict[str, Any]]:
    """Run any Pulumi program under the mock engine (no CLI, no credentials): every resource it
    registers, in a stable order, and its stack outputs (secret ones masked). `calls` answers
    invokes (token, args → result), e.g. gcp:container/getCluster:getCluster; `pulumi_project`
    is the project name its `pulumi.Config()` reads keys under."""
    import pulumi
    import pulumi.runtime
    from google.protobuf import json_format
    from pulumi.runtime import mocks, settings
    from pulumi.runtime.settings import _get_rpc_manager
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    recorded: list[Resource] = []
    outputs: dict[str, Any] = {}
    duplicates: list[str] = []
    registered: set[str] = set()
    registering = threading.Lock()

    class ParkMocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            return f"{args.name}-id", _mock_outputs(args.typ, args.name, args.inputs, project)

        def call(self, args: pulumi.runtime.MockCallArgs):
            return calls(args.token, dict(args.args)) if calls else _mock_call(args.token, project)

    class RecordingMonitor(mocks.MockMonitor):
        def make_urn(self, parent: str, type_: str, name: str) -> str:
            """The engine's URN: the parent's type chain, then the type and the name."""
            chain = type_
            parent_type = parent.split("::")[2] if parent else ""
            if parent_type and parent_type != "pulumi:pulumi:Stack":
                chain = f"{parent_type}${type_}"
            return "urn:pulumi:" + "::".join([stack, pulumi_project, chain, name])

        def RegisterResource(self, request):
            urn = self.make_urn(request.parent, request.type, request.name)
            with registering:  # the SDK registers from several threads at once
                if urn in registered:
                    duplicates.append(urn)  # what the engine refuses at preview
                registered.add(urn)
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                parent = request.parent.split("::")[-1] if request.parent else None
                if parent == f"{pulumi_project}-{stack}":
                    parent = None  # the stack itself
                recorded.append(
                    Resource(
                        type=request.type,
                        name=request.name,
                        parent=parent,
                        inputs=_clean(json_format.MessageToDict(request.object)),
                        custom=request.custom,
                        dependencies=[urn.split("::")[-1] for urn in request.dependencies],
                        provider=_provider_name(request.provider),
                        ignore_changes=list(request.ignoreChanges),
                        waits=[
                            _typed(u)
                            for u in [*request.dependencies, request.provider.rsplit("::", 1)[0]]
                            if u
                        ],
                    )
                )
            return response

    the_mocks = ParkMocks()
    settings.ROOT.set(None)
    # A program that failed before this one leaves its unawaited RPCs (and their error) behind.
    _get_rpc_manager().clear()
    pulumi.runtime.set_mocks(
        the_mocks,
        project=pulumi_project,
        stack=stack,
        preview=False,
        monitor=RecordingMonitor(the_mocks),
    )
    values = config or {}
    pulumi.runtime.set_all_config(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()},
        secret_keys or [],
    )
    # The provider modules leave a large heap; the collector rescanning it made render time
    # grow faster than the resource count (benchmarks/render.py). Nothing here forms cycles
    # worth collecting mid-run.
    gc.disable()
    try:
        _sync_await(run_pulumi_func(program))
    except Exception as err:
        _sync_await(_drain(_get_rpc_manager()))
        raise ProgramError(str(err), recorded) from err
    finally:
        gc.enable()
    if duplicates:
        raise ProgramError(
            f"Duplicate resource URN '{duplicates[0]}'; try giving it a unique name", recorded
        )
    exported = settings.get_root_resource().outputs  # type: ignore[union-attr]
    resolved = _sync_await(pulumi.Output.secret(exported).future()) if exported else {}
    outputs.update(_mask_outputs(exported, resolved or {}))
    # Registration order depends on when outputs resolve; sort so renders diff cleanly.
    recorded.sort(key=lambda r: (r.type, r.name))
    return recorded, outputs


def run_program(
    values: dict[str, Any],
    stack: str,
    secret_keys: list[str] | None = None,
    *,
    prevalidate: bool = True,
    plan: StackPlan | None = None,
) -> Rendered:
    """Run the stack program under mocks with these config values; return what it registered.

    The stack is resolved once: `plan` when given (resolved from these values), else here
    before the run (a bad config raises ConfigError and registers nothing), else, with
    `prevalidate` False, by the program itself (infra.program.main, as `pulumi up` runs it)."""
    from infra import program

    if plan is None and prevalidate:
        plan = stack_front.from_values(values, stack, secret_keys or ())
    built: list[StackPlan] = [] if plan is None else [plan]

    def run() -> None:
        if not built:
            built.append(program.load_plan()[0])
        program.build(built[0], program.read_pulumi_config()[1])

    resources, outputs = run_under_mocks(
        run,
        stack=stack,
        project=str(values.get("gcp:project", "project")),
        config=values,
        secret_keys=secret_keys,
    )
    return Rendered(plan=built[0], resources=resources, outputs=outputs)


def render_stack_file(
    path: Path, stack: str | None = None, esc_config: Path | None = None
) -> Rendered:
    offline = stack_front.read_offline(path, stack, esc_config)
    plan = stack_front.from_file(  # names unopened ESC environments in its errors
        path, stack, esc_config
    )
    return run_program(offline.values, offline.stack, offline.secret_keys, plan=plan)


# ---------------------------------------------------------------------------------------------
# Output files


def _manifest_of(resource: Resource) -> dict[str, Any]:
    inputs = dict(resource.inputs)
    manifest: dict[str, Any] = {
        "apiVersion": inputs.pop("apiVersion"),
        "kind": inputs.pop("kind"),
    }
    manifest.update(inputs)
    return manifest


def manifest_filename(manifest: dict[str, Any]) -> str:
    return f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"


def write_outputs(rendered: Rendered, out: Path) -> None:
    """resources.json (every registered resource), resources.mmd (its Mermaid flowchart,
    infra/tools/flowchart.py), placement.mmd (what runs where, infra/tools/placement.py) and
    manifests/<kind>-<name>.yaml, through
    the one writer (infra.tools.outdir): `out` holds only what park wrote there, no link is
    followed, and nothing outside it is written, replaced or deleted."""
    files: dict[str, bytes] = {
        "resources.json": (
            json.dumps([r.as_json() for r in rendered.resources], indent=2, sort_keys=True) + "\n"
        ).encode(),
        "resources.mmd": flowchart([r.as_json() for r in rendered.resources]).encode(),
        "placement.mmd": placement_chart(rendered.plan).encode(),
    }
    for manifest in rendered.manifests():
        text = yaml.safe_dump(manifest, sort_keys=False, width=100)
        files[f"manifests/{manifest_filename(manifest)}"] = text.encode()
    write_owned(out, files)
