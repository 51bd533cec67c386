"""What the workload identity may do on the stack's bucket, and what each workload needs there.

Two committed facts meet here:

- the **grant**: the storage.* permissions of the roles the stack binds on its bucket
  (infra/plan/storage.py `BUCKET_ROLES`), from Google's predefined roles vendored in
  infra/data/storage_roles.yaml;
- the **ledger**: per workload, the bucket permissions it needs, each with the call that needs
  it (infra/data/bucket_ledger.yaml). The workloads' own entries are what `park local` recorded
  when it ran them against an emulated Cloud Storage that enforces the grant
  (infra/tools/local/gcs_gate.py); the FUSE mounts' are what Cloud Storage FUSE documents.

`park validate` prints the ledger with the role that grants each permission; a permission no
role grants is a problem at preview, and a call a workload makes outside the ledger fails the
tests that run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra import datafile

ROLES_FILE = Path(__file__).parent / "data" / "storage_roles.yaml"
LEDGER_FILE = Path(__file__).parent / "data" / "bucket_ledger.yaml"


def _roles() -> dict[str, tuple[str, ...]]:
    data = datafile.load(ROLES_FILE)
    return {role: tuple(perms) for role, perms in data["roles"].items()}


def known_roles() -> tuple[str, ...]:
    return tuple(sorted(_roles()))


def role_permissions(role: str) -> frozenset[str]:
    """The storage.* permissions of a predefined role; KeyError naming the known ones."""
    roles = _roles()
    if role not in roles:
        raise KeyError(f"{role!r} is not a vendored Cloud Storage role; known: {known_roles()}")
    return frozenset(roles[role])


def granted(roles: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Every bucket permission the roles grant together."""
    found: set[str] = set()
    for role in roles:
        found |= role_permissions(role)
    return frozenset(found)


def granting_roles(permission: str, roles: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Which of `roles` grant `permission` (empty: none does)."""
    return tuple(r for r in roles if permission in role_permissions(r))


@dataclass(frozen=True)
class Need:
    """One permission a workload needs on the bucket, and the call that needs it."""

    permission: str
    why: str


@dataclass(frozen=True)
class WorkloadNeeds:
    """A workload's bucket permissions, and where that list comes from."""

    workload: str  # the gate's label: staging, trainer, rl, serving-fuse, ...
    what: str  # what runs, in words
    source: str  # "recorded by park local ..." or the documentation it follows
    needs: tuple[Need, ...]

    @property
    def permissions(self) -> frozenset[str]:
        return frozenset(n.permission for n in self.needs)


def ledger() -> tuple[WorkloadNeeds, ...]:
    """Every workload's entry of infra/data/bucket_ledger.yaml, in file order."""
    data = datafile.load(LEDGER_FILE)
    return tuple(
        WorkloadNeeds(
            workload=name,
            what=entry["what"],
            source=entry["source"],
            needs=tuple(Need(p, why) for p, why in entry["needs"].items()),
        )
        for name, entry in data["workloads"].items()
    )


def ledger_of(workload: str) -> WorkloadNeeds:
    for entry in ledger():
        if entry.workload == workload:
            return entry
    raise KeyError(f"no ledger entry for {workload!r}; known: {[e.workload for e in ledger()]}")


@dataclass(frozen=True)
class LedgerRow:
    workload: str
    permission: str
    why: str
    roles: tuple[str, ...]  # the stack's roles that grant it; empty: not granted


def ledger_rows(
    roles: tuple[str, ...] | list[str], workloads: tuple[str, ...] | None = None
) -> list[LedgerRow]:
    """The ledger against a grant: one row per workload and permission (only `workloads`,
    when given, in ledger order)."""
    return [
        LedgerRow(entry.workload, need.permission, need.why, granting_roles(need.permission, roles))
        for entry in ledger()
        if workloads is None or entry.workload in workloads
        for need in entry.needs
    ]


def missing(
    roles: tuple[str, ...] | list[str], workloads: tuple[str, ...] | None = None
) -> list[LedgerRow]:
    """Ledger rows that no role of the grant covers: each one a call that fails with 403."""
    return [row for row in ledger_rows(roles, workloads) if not row.roles]
