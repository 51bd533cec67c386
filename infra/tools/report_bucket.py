"""What `park validate` says of the cloud's own rules before the first `up`: what must be on
before Pulumi can enable anything, and each workload's bucket permissions against the roles
the stack grants (the ledger, infra/storage_iam.py)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra import storage_iam
from infra.plan.storage import storage
from infra.resolve import StackPlan

# What `up` cannot enable itself: Service Usage enables the others, and pulumi-gcp's Service
# reads the project through Cloud Resource Manager right after enabling (Terraform's
# google_project_service; hashicorp/terraform-provider-google #6101, #11435): on a new project
# whose CRM API is off, every Service of the stack fails.
PREREQUISITE_APIS = ("serviceusage.googleapis.com", "cloudresourcemanager.googleapis.com")


def prerequisite_command(project: str) -> str:
    """The one command that enables what `up` cannot."""
    return f"gcloud services enable {' '.join(PREREQUISITE_APIS)} --project {project}"


def prerequisites(plan: StackPlan, out: Console) -> None:
    table = Table(title="before the first `pulumi up`: enable what `up` cannot enable itself")
    table.add_column("API")
    table.add_column("why")
    table.add_row(PREREQUISITE_APIS[0], "enables every other API the stack uses")
    table.add_row(
        PREREQUISITE_APIS[1],
        "pulumi-gcp reads the project through it right after enabling each API",
    )
    out.print(table)
    out.print(f"  run once: {escape(prerequisite_command(plan.spec.project))}", highlight=False)


def ledger_workloads(plan: StackPlan) -> tuple[str, ...]:
    """The ledger's workloads this stack runs."""
    found: list[str] = []
    if plan.disk is not None and plan.disk.staged:
        found.append("staging")
    if plan.training is not None:
        found += ["training", "training-fuse"]
    if plan.rl is not None:
        found.append("rl")
    if plan.serving is not None:
        found.append("serving-fuse")
    return tuple(found)


def bucket_ledger(plan: StackPlan, out: Console) -> int:
    """Print each workload's bucket permissions and the stack's role granting each; return how
    many no role grants (each one a 403 on the first run)."""
    roles = storage(plan).bucket_roles
    rows = storage_iam.ledger_rows(roles, ledger_workloads(plan))
    table = Table(title=f"bucket permissions of the workload identity (roles: {', '.join(roles)})")
    for column in ("workload", "permission", "granted by", "for"):
        table.add_column(column)
    for row in rows:
        granted = ", ".join(row.roles) if row.roles else "[red]NOT GRANTED[/]"
        table.add_row(row.workload, row.permission, granted, escape(row.why))
    out.print(table)
    return sum(1 for row in rows if not row.roles)
