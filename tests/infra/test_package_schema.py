"""One definition of each field: a component argument that stands for a stack-spec field says
what the spec field's docstring says, with its type and default; the provider schema other
languages read is the SDK analyzer's, held as a golden, with the enums, secrets and the pool
reference the analyzer alone does not give."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Awaitable
from enum import Enum
from typing import Any

import pulumi.output
import pytest
from pydantic import BaseModel

import park_gke
from infra import catalog
from infra.components import _args, _types
from infra.components._base import output_names
from infra.components._checks import mapping_problems
from infra.schema import jobs, models
from infra.stack import from_file
from park_gke import provider
from tests.conftest import ROOT, STACKS_DIR

SCHEMA = ROOT / "provider" / "schema.json"
NS = (models.StackConfig, "namespace")
M = models

# args class → (the spec model its same-named arguments stand for, or None; arguments standing
# for another spec field; arguments that are the component's own: a different meaning or default)
ARG_SPEC: dict[str, tuple[type[BaseModel] | None, dict[str, tuple[Any, str]], set[str]]] = {
    "NetworkArgs": (M.NetworkConfig, {}, set()),
    "ClusterArgs": (
        M.ClusterConfig,
        {
            "master_cidr": (M.NetworkConfig, "master_cidr"),
            "pods_range_name": (M.NetworkConfig, "pods_range_name"),
            "services_range_name": (M.NetworkConfig, "services_range_name"),
            "ray_logging": (M.KubeRayConfig, "logging"),
            "ray_monitoring": (M.KubeRayConfig, "monitoring"),
        },
        set(),
    ),
    "AuthorizedNetworkArgs": (M.AuthorizedNetwork, {}, set()),
    "CpuPoolArgs": (M.CpuPoolConfig, {}, {"name"}),  # default: the component's name
    "TpuSlicePoolArgs": (
        M.TpuPoolConfig,
        {"extra_zones": (M.StackConfig, "extra_tpu_zones")},
        {"name"},
    ),
    "GpuPoolArgs": (M.GpuPoolConfig, {}, {"name"}),
    "TpuPoolRefArgs": (M.TpuPoolConfig, {}, {"name"}),  # names the pool's nodes' label
    "StorageArgs": (
        M.StorageConfig,
        {
            "bucket_location": (M.StorageConfig, "location"),
            "repository": (M.RegistryConfig, "repository"),
            "create_repository": (M.RegistryConfig, "create"),
            "namespace": NS,
        },
        set(),
    ),
    "KubeRayOperatorArgs": (M.KubeRayConfig, {}, set()),
    "WorkspaceArgs": (
        None,
        {
            "namespace": NS,
            "kuberay_install": (M.KubeRayConfig, "install"),
            "master_cidr": (M.NetworkConfig, "master_cidr"),
        },
        set(),
    ),
    "ExistingClusterArgs": (None, {"kuberay_install": (M.KubeRayConfig, "install")}, set()),
    "KueueArgs": (M.KueueConfig, {"namespace": NS}, set()),
    # TrainingArgs: written from park:training's keys (infra/tools/fields.py, tests/infra/
    # test_fields.py), not mirrored by hand
    # namespace, bucket: in Python, the Workspace and the Storage themselves
    "RayTrainingJobArgs": (
        None,
        {
            "mount_path": (M.StorageConfig, "mount_path"),
            "image": (jobs.TrainingConfig, "image"),
            "tpu_metrics": (M.ObservabilityConfig, "tpu_metrics"),
        },
        set(),
    ),
    # source: the component serves a path or an export, not the stack's `training`/`rl`
    "ServedModelArgs": (M.ServedModel, {}, {"source"}),
    "LlmServiceArgs": (
        M.ServingConfig,
        {
            "mount_path": (M.StorageConfig, "mount_path"),
            "tpu_metrics": (M.ObservabilityConfig, "tpu_metrics"),
        },
        {"pool"},  # the pool itself, not its name
    ),
    "RayMetricsArgs": (M.ObservabilityConfig, {"namespace": NS}, set()),
    "DashboardAccessArgs": (
        None,
        {
            "domain": (M.ObservabilityConfig, "dashboard_domain"),
            "iap_members": (M.ObservabilityConfig, "iap_members"),
            "oauth_client_id": (M.ObservabilityConfig, "iap_oauth_client_id"),
            "oauth_secret": (M.ObservabilityConfig, "iap_oauth_secret"),
            "namespace": NS,
        },
        set(),
    ),
}


def _args_class(name: str) -> type:
    return getattr(park_gke, name, None) or getattr(_args, name)


def mirrored() -> list[tuple[str, str, type[BaseModel], str]]:
    """(args class, argument, spec model, spec field) for every argument standing for one."""
    out = []
    for args_name, (model, renamed, own) in ARG_SPEC.items():
        for arg in _args_class(args_name).__annotations__:
            if arg in own:
                continue
            if arg in renamed:
                out.append((args_name, arg, *renamed[arg]))
            elif model is not None and arg in model.model_fields:
                out.append((args_name, arg, model, arg))
    return out


def _bare(hint: Any) -> Any:
    """NotRequired, Optional and pulumi.Input unwrapped: the value's own type."""
    origin = typing.get_origin(hint)
    if origin in (typing.NotRequired, typing.Required):
        return _bare(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        plain = [
            a
            for a in typing.get_args(hint)
            if a is not type(None)
            and typing.get_origin(a) not in (pulumi.Output, Awaitable)
            and not isinstance(a, typing.ForwardRef)
        ]
        return _bare(plain[0]) if len(plain) == 1 else hint
    return hint


def type_problem(arg_hint: Any, spec_hint: Any) -> str | None:
    """Why an argument's type is not its spec field's (None: it is)."""
    arg, spec = _bare(arg_hint), _bare(spec_hint)
    if typing.get_origin(spec) is typing.Literal:
        if isinstance(arg, type) and issubclass(arg, Enum):
            values = {m.value for m in arg}
            return None if values == set(typing.get_args(spec)) else f"{values} vs {spec}"
        return f"{arg} is not an enum of {typing.get_args(spec)}"
    if isinstance(arg, type) and issubclass(arg, Enum):
        catalog_enums = (_types.TpuMachineType, _types.TpuTopology)
        return None if spec is str and arg in catalog_enums else f"{arg} vs {spec}"
    if typing.get_origin(spec) is list:
        if typing.get_origin(arg) is not list:
            return f"{arg} is not a list"
        return type_problem(typing.get_args(arg)[0], typing.get_args(spec)[0])
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return None if typing.is_typeddict(arg) else f"{arg} is not a TypedDict"
    if typing.get_origin(spec) is dict:
        return None if typing.get_origin(arg) is dict or arg is dict else f"{arg} vs {spec}"
    return None if arg is spec else f"{arg} vs {spec}"


def _docstring(args_name: str, arg: str) -> str:
    doc = provider.analyzer().get_docstring(_args_class(args_name), arg) or ""
    return " ".join(doc.split())


def mirror_problems() -> list[str]:
    problems = []
    for args_name, arg, model, field in mirrored():
        cls = _args_class(args_name)
        hints = typing.get_type_hints(cls, localns=vars(pulumi.output), include_extras=True)
        required = arg in cls.__required_keys__
        expected = _types.spec_doc(model, field, default=not required)
        if _docstring(args_name, arg) != expected:
            problems.append(f"{args_name}.{arg}: docstring should be {expected!r}")
        why = type_problem(hints[arg], model.model_fields[field].annotation)
        if why:
            problems.append(f"{args_name}.{arg}: type of {model.__name__}.{field}: {why}")
    return problems


def test_every_argument_standing_for_a_spec_field_says_what_the_field_says():
    assert mirror_problems() == []
    assert len(mirrored()) > 80  # the table reaches the arguments, not a handful


def test_a_changed_description_or_default_in_the_spec_fails_the_check(monkeypatch):
    """The drift the check exists for: one image default once disagreed."""
    field = jobs.TrainingConfig.model_fields["image"]
    monkeypatch.setattr(field, "description", "Image (default: somewhere else).")
    assert any("RayTrainingJobArgs.image" in p for p in mirror_problems())
    monkeypatch.undo()
    monkeypatch.setattr(M.CpuPoolConfig.model_fields["machine_type"], "default", "e2-standard-4")
    assert any("CpuPoolArgs.machine_type" in p for p in mirror_problems())


def test_a_changed_argument_type_fails_the_check():
    assert type_problem(str, models.ClusterConfig.model_fields["release_channel"].annotation)
    assert type_problem(int, models.CpuPoolConfig.model_fields["machine_type"].annotation)
    assert type_problem(_types.Capacity, jobs.TrainingConfig.model_fields["strategy"].annotation)


def test_every_spec_key_of_a_mirrored_section_is_a_component_argument():
    """A key added to a section of the stack config without its component argument fails."""
    taken = {(model, field) for _, _, model, field in mirrored()}
    sections = {
        M.TpuPoolConfig: {"name"},  # the component's own (default: its name)
        M.GpuPoolConfig: {"name"},
        M.CpuPoolConfig: set(),
        M.ServedModel: {"source"},
        M.NetworkConfig: set(),
        M.ClusterConfig: set(),
        M.StorageConfig: set(),
        M.RegistryConfig: set(),
        M.KubeRayConfig: set(),
        M.ServingConfig: {"enabled", "pool"},  # the component is the enabled section on `pool`
    }
    missing = [
        f"{model.__name__}.{f}"
        for model, own in sections.items()
        for f in model.model_fields
        if f not in own and (model, f) not in taken
    ]
    assert missing == []


def test_the_training_argument_is_the_training_section():
    """RayTrainingJob takes park:training's own keys, typed: every one accepted, none invented;
    a shipped stack's training section, as its own keys, has the argument's shapes."""
    plan = from_file(STACKS_DIR / "Pulumi.prod.yaml")
    assert plan.training is not None
    keys = set(jobs.TrainingConfig.model_fields) - {"enabled", "pool", "image"}
    assert set(_args.TrainingArgs.__annotations__) == keys
    settings = plan.training.spec.model_dump(include=keys, exclude_none=True)
    assert mapping_problems(settings, _args.TrainingArgs) == []


# ---- the schema --------------------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text())


def test_the_schema_the_analyzer_infers_is_the_committed_golden():
    now = provider.schema()
    assert now == _schema(), (
        "the components' arguments or outputs changed: run "
        "`python -m park_gke.provider > provider/schema.json` and review the diff"
    )


def test_the_plugin_serves_the_committed_schema():
    """What `pulumi package add` gets from the plugin: with the secrets, enum member and
    inherited argument descriptions the SDK's own analyzer leaves out."""
    host = provider.ParkComponentProvider(provider.components(), provider.NAME, None, "0.0.0")
    served = json.loads(host.schema)
    assert served == provider.schema("0.0.0")
    assert served["resources"] == _schema()["resources"]


def test_every_schema_property_says_what_it_is():
    schema = _schema()
    undocumented = [
        f"{token}.{prop}"
        for token, spec in [*schema["resources"].items(), *schema["types"].items()]
        for section in ("inputProperties", "properties")
        for prop, body in spec.get(section, {}).items()
        if not body.get("description")
    ]
    assert not undocumented
    for token, spec in schema["resources"].items():
        assert spec.get("description"), token
        assert spec["isComponent"] is True


def _enum(name: str) -> list[str]:
    return [v["value"] for v in _schema()["types"][f"park-gke:index:{name}"]["enum"]]


def test_the_schema_enums_are_the_catalogs_and_the_specs_values():
    assert _enum("TpuMachineType") == list(catalog.MACHINE_TYPES)
    topologies = {t for m in catalog.MACHINE_TYPES.values() for t in m.topologies}
    assert set(_enum("TpuTopology")) == topologies
    assert _enum("Capacity") == list(models.CAPACITY_TYPES)
    engines = typing.get_args(models.ServingConfig.model_fields["engine"].annotation)
    assert _enum("ServingEngine") == list(engines)
    assert _enum("Strategy") == list(typing.get_args(jobs.Strategy))
    assert _enum("ReleaseChannel") == list(typing.get_args(models.ReleaseChannel))
    enums = [t for t in _schema()["types"].values() if "enum" in t]
    assert len(enums) == len(_types.ENUMS)


def _prop(component: str, section: str, prop: str) -> dict[str, Any]:
    return _schema()["resources"][f"park-gke:index:{component}"][section][prop]


def test_the_tpu_pool_arguments_are_enums():
    for prop in ("machineType", "topology", "capacity"):
        ref = _prop("TpuSlicePool", "inputProperties", prop)["$ref"]
        assert ref.rsplit(":", 1)[-1] in ("TpuMachineType", "TpuTopology", "Capacity")


def test_a_component_registers_the_outputs_the_analyzer_publishes():
    """`register` reads a component's outputs as Pulumi's analyzer does, its bases' too
    (ClusterComponent declares what Cluster and ExistingCluster both hand on), so none is
    published and left unset."""
    for component in provider.components():
        _, mapping = provider.analyzer().analyze_type(component, is_component_output=True)
        assert sorted(output_names(component)) == sorted(mapping.values()), component.__name__
    shared = {"name", "endpoint", "kubeconfig", "node_service_account", "cluster_id"}
    assert shared <= set(output_names(park_gke.Cluster)) & set(
        output_names(park_gke.ExistingCluster)
    )
    for prop in ("clusterId", "kubeconfig", "nodeServiceAccount"):
        described = _prop("Cluster", "properties", prop)["description"]
        assert described == _prop("ExistingCluster", "properties", prop)["description"]


def test_secrets_are_marked_in_the_schema():
    assert _prop("Workspace", "inputProperties", "hfToken").get("secret") is True
    assert _prop("Cluster", "properties", "kubeconfig").get("secret") is True
    assert _prop("ExistingCluster", "properties", "kubeconfig").get("secret") is True
    secrets = [
        f"{token}.{prop}"
        for token, spec in _schema()["resources"].items()
        for section in ("inputProperties", "properties")
        for prop, body in spec.get(section, {}).items()
        if body.get("secret")
    ]
    listed = provider.secret_properties()
    assert len(secrets) == sum(len(p) for s in listed.values() for p in s.values())
    hf_flag = _prop("RayTrainingJob", "inputProperties", "hfToken")  # a flag, not the token
    assert "secret" not in hf_flag


def test_an_unknown_secret_property_is_refused():
    with pytest.raises(KeyError):
        provider.mark_secrets(provider.schema(), {"Workspace": {"inputProperties": ["hfTokn"]}})


def test_the_pool_reference_is_an_output_of_the_pool_and_the_workloads_input():
    ref = _prop("TpuSlicePool", "properties", "poolRef")["$ref"]
    assert ref == "#/types/park-gke:index:TpuPoolRefArgs"
    assert _prop("RayTrainingJob", "inputProperties", "pool")["$ref"] == ref
    assert _prop("LlmService", "inputProperties", "pool")["$ref"] == ref


def test_training_and_serving_arguments_are_typed():
    training = _prop("RayTrainingJob", "inputProperties", "training")
    assert training["$ref"] == "#/types/park-gke:index:TrainingArgs"
    typed = _schema()["types"]["park-gke:index:TrainingArgs"]["properties"]
    assert typed["strategy"]["$ref"].endswith(":Strategy")
    assert typed["globalBatchSize"]["type"] == "integer"
    models_ = _prop("LlmService", "inputProperties", "models")
    assert models_["items"]["$ref"] == "#/types/park-gke:index:ServedModelArgs"
    assert _prop("LlmService", "inputProperties", "engine")["$ref"].endswith(":ServingEngine")


def test_inputs_that_may_be_unknown_at_preview_take_outputs():
    """Not plain: TypeScript and Go pass an Output (another resource's output) there."""
    takes_outputs = [
        ("CpuPool", "cluster"),
        ("TpuSlicePool", "nodeServiceAccount"),
        ("Cluster", "network"),
        ("Workspace", "hfToken"),
        ("LlmService", "kubeconfig"),
    ]
    for component, prop in takes_outputs:
        assert not _prop(component, "inputProperties", prop).get("plain"), (component, prop)


def test_a_value_outside_an_enum_is_refused_at_its_property_through_the_provider():
    """YAML (or an untyped call) sending a machine type the catalog lacks: the SDK maps the
    input through the schema's enum and refuses it at the property, before the component."""
    from pulumi.errors import InputPropertyError

    from infra.tools.render import ProgramError
    from park_gke import testing
    from tests.infra.test_package import MINIMAL, _wire

    host = provider.ParkComponentProvider(provider.components(), provider.NAME, None, "0.0.0")
    wire = _wire({**MINIMAL["TpuSlicePool"][0], "machine_type": "ct6e-standard-9t"})
    with pytest.raises(ProgramError) as err:
        testing.run(lambda: host.construct("it", "park-gke:index:TpuSlicePool", wire, None))
    cause = err.value.__cause__
    assert isinstance(cause, InputPropertyError)
    assert "machineType" in str(cause) and "TpuMachineType" in str(cause)


def test_python_callers_pass_plain_strings_or_the_enum_members():
    from park_gke import testing
    from tests.infra.test_package import MINIMAL

    args = MINIMAL["TpuSlicePool"][0]
    members = {"machine_type": _types.TpuMachineType(args["machine_type"]), "capacity": "spot"}

    refs = []

    def build() -> None:
        park_gke.TpuSlicePool("plain", {**args, "name": "plain"})
        refs.append(park_gke.TpuSlicePool("members", {**args, **members, "name": "members"}).ref)

    testing.run(build, project="p")
    assert type(refs[0]["machine_type"]) is str  # planned from, as the spec holds it
    assert refs[0]["machine_type"] == args["machine_type"] and refs[0]["capacity"] == "spot"
