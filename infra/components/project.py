"""The project's APIs, enabled before anything that calls them (infra/plan/project.py)."""

from typing import TypedDict

import pulumi

from infra.components._base import Component, bad_value
from infra.plan.project import API_SETTLE_S, Api


class ProjectApisArgs(TypedDict):
    """Google APIs to enable in a project; a `pulumi destroy` leaves them on (other stacks and
    teams in the project may use them)."""

    project: str
    """The GCP project."""
    services: list[str]
    """APIs to enable, e.g. `container.googleapis.com`."""


class ProjectApis(Component):
    """The APIs a stack calls, on: what every other component waits for on a new project."""

    services: pulumi.Output[list[str]]
    """The APIs enabled."""

    def __init__(
        self, name: str, args: ProjectApisArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, ProjectApisArgs)
        wrong = [s for s in args["services"] if not s.endswith(".googleapis.com") or "/" in s]
        if wrong:
            self.refuse([bad_value("services", wrong, "API names, <name>.googleapis.com")])
        self._build(args["project"], [Api(s, "") for s in args["services"]])

    @classmethod
    def of_plan(
        cls,
        name: str,
        project: str,
        apis: tuple[Api, ...],
        opts: pulumi.ResourceOptions | None = None,
    ) -> "ProjectApis":
        """The stack program's: the APIs its plan calls (infra.plan.project.apis)."""
        self = cls.planned(name, opts)
        self._build(project, list(apis))
        return self

    def _build(self, project: str, apis: list[Api]) -> None:
        from pulumi_gcp.projects import Service

        self.enabled = [
            Service(
                f"{self._component_name}-{api.service.split('.')[0]}",
                project=project,
                service=api.service,
                disable_on_destroy=False,
                disable_dependent_services=False,
                opts=self.child_options(),
            )
            for api in apis
        ]
        # Enabling propagates for a while: every component that waits for this one waits for
        # the settling too (a child), once, and again when the list of APIs changes.
        from pulumiverse_time import Sleep

        services = sorted(api.service for api in apis)
        Sleep(
            f"{self._component_name}-settle",
            create_duration=f"{API_SETTLE_S}s",
            triggers={"services": ",".join(services)},
            opts=pulumi.ResourceOptions.merge(
                self.child_options(), pulumi.ResourceOptions(depends_on=self.enabled)
            ),
        )
        self.services = pulumi.Output.from_input([api.service for api in apis])
        self.register()
