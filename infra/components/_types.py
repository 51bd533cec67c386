"""The component arguments' enums and the spec's descriptions they repeat, from one source each.

Each enum is built from the data it stands for (the TPU catalog's machine types and topologies,
the stack spec's Literals), so a machine type added to infra/catalog.py or an engine added to
the spec is an enum value of the provider schema without another edit. Pulumi's analyzer turns an
`enum.Enum` into a schema enum (TypeScript, Go, C# get a typed constant); Python callers pass the
plain string as before: for the type checker each `...Arg` is the Literal (or `str`) itself, and
at run time a StrEnum member is a `str` the spec validates like any other.

`spec_doc` is what a component argument that stands for a spec field says about it: the field's
docstring and its default (tests/infra/test_package.py holds every such argument to it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, get_args

from pydantic import BaseModel

from infra import catalog
from infra.schema import jobs, models


def _member_name(value: str, prefix: str) -> str:
    """``on-demand`` → ``ON_DEMAND``, ``NewCluster`` → ``NEW_CLUSTER``, ``2x4`` → ``T2X4`` (an
    identifier in every language: one that would start with a digit takes a prefix, ``V``)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", value)
    name = re.sub(r"[^0-9A-Za-z]+", "_", snake).strip("_").upper()
    return f"{prefix or 'V'}{name}" if prefix or name[:1].isdigit() else name


def values_enum(name: str, doc: str, values: Iterable[str], prefix: str = "") -> type[StrEnum]:
    """A StrEnum of `values` (order kept, duplicates dropped), defined in this module."""
    members = {_member_name(v, prefix): v for v in dict.fromkeys(values)}
    enum = StrEnum(name, members, module=__name__)  # type: ignore[misc]
    enum.__doc__ = doc
    return enum


def literal_values(model: type[BaseModel], field: str) -> tuple[str, ...]:
    """The values a spec field's Literal allows (its Optional unwrapped)."""
    annotation = model.model_fields[field].annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    if len(args) == 1 and get_args(args[0]):
        args = list(get_args(args[0]))
    return tuple(args)


TpuMachineType = values_enum(
    "TpuMachineType",
    "A TPU machine type of the catalog (infra/catalog.py).",
    catalog.MACHINE_TYPES,
)
TpuTopology = values_enum(
    "TpuTopology",
    "A TPU slice topology some machine type of the catalog offers (each machine type offers "
    "only some: the component refuses the others, naming those allowed).",
    (t for m in catalog.MACHINE_TYPES.values() for t in m.topologies),
    prefix="T",
)
# (enum, what it is, the spec field whose Literal it is)
_FROM_SPEC: tuple[tuple[str, str, type[BaseModel], str], ...] = (
    ("Capacity", "How a pool's nodes are obtained and billed.", models.TpuPoolConfig, "capacity"),
    ("ReleaseChannel", "The GKE release channel.", models.ClusterConfig, "release_channel"),
    ("KubeRayInstall", "GKE's Ray Operator add-on or Helm.", models.KubeRayConfig, "install"),
    ("ServingEngine", "The serving engine (and its image).", models.ServingConfig, "engine"),
    ("UpgradeStrategy", "How a RayService upgrades.", models.ServingConfig, "upgrade_strategy"),
    ("Strategy", "Data parallelism of the trainer.", jobs.TrainingConfig, "strategy"),
    ("TrainingInit", "Where the first weights come from.", jobs.TrainingConfig, "init"),
    ("ModelSize", "A GPT preset.", jobs.TrainingConfig, "model_size"),
    ("LrSchedule", "The learning-rate schedule.", jobs.TrainingConfig, "lr_schedule"),
    ("Objective", "The training objective.", jobs.TrainingConfig, "objective"),
    ("ExportDtype", "The exported weights' dtype.", jobs.TrainingConfig, "export_dtype"),
)
SPEC_ENUMS: dict[str, type[StrEnum]] = {
    name: values_enum(name, doc, literal_values(model, field))
    for name, doc, model, field in _FROM_SPEC
}
Capacity = SPEC_ENUMS["Capacity"]
ENUMS: tuple[type[StrEnum], ...] = (TpuMachineType, TpuTopology, *SPEC_ENUMS.values())

# What an argument's annotation names: the enum for the analyzer, the plain value for mypy.
if TYPE_CHECKING:
    TpuMachineTypeArg = str
    TpuTopologyArg = str
    CapacityArg = models.Capacity
    ReleaseChannelArg = models.ReleaseChannel
    KubeRayInstallArg = models.KubeRayInstall
    ServingEngineArg = str
    UpgradeStrategyArg = models.UpgradeStrategy
    StrategyArg = jobs.Strategy
    TrainingInitArg = jobs.TrainingInit
    ModelSizeArg = jobs.ModelSize
    LrScheduleArg = jobs.LrSchedule
    ObjectiveArg = jobs.Objective
    ExportDtypeArg = jobs.ExportDtype
else:
    TpuMachineTypeArg = TpuMachineType
    TpuTopologyArg = TpuTopology
    CapacityArg = Capacity
    ReleaseChannelArg = SPEC_ENUMS["ReleaseChannel"]
    KubeRayInstallArg = SPEC_ENUMS["KubeRayInstall"]
    ServingEngineArg = SPEC_ENUMS["ServingEngine"]
    UpgradeStrategyArg = SPEC_ENUMS["UpgradeStrategy"]
    StrategyArg = SPEC_ENUMS["Strategy"]
    TrainingInitArg = SPEC_ENUMS["TrainingInit"]
    ModelSizeArg = SPEC_ENUMS["ModelSize"]
    LrScheduleArg = SPEC_ENUMS["LrSchedule"]
    ObjectiveArg = SPEC_ENUMS["Objective"]
    ExportDtypeArg = SPEC_ENUMS["ExportDtype"]


def member_docs(enum: str) -> dict[str, str]:
    """What each value of an enum named `enum` is, from the catalog (empty for the others)."""
    if enum == "TpuMachineType":
        return {
            m.name: f"TPU {m.generation}, chips per host: {m.chips_per_host}; topologies: "
            f"{', '.join(m.topologies)}."
            for m in catalog.MACHINE_TYPES.values()
        }
    if enum == "TpuTopology":
        return {t.value: f"{math.prod(catalog.topology_dims(t.value))} chips." for t in TpuTopology}
    return {}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(_shown(v) for v in value)
    return str(value)


def spec_doc(model: type[BaseModel], field: str, default: bool = True) -> str:
    """What a component argument standing for `model.field` says: the field's docstring, then
    its default when it has one and the argument may be left out (None and empty defaults are
    the docstring's to explain)."""
    info = model.model_fields[field]
    text = " ".join((info.description or "").split())
    value = info.default
    if not default or info.is_required() or value is None or value in ([], {}, ""):
        return text
    return f"{text} Default: {_shown(value)}."
