"""`park preflight STACK`: what the stack's capacity ladders can get, judged from API answers.

Pure functions, no I/O: from the stack's plan (never recomputed) and the answers of Google's
APIs (dicts, as JSON decodes them) to findings. infra/tools/preflight_read.py fetches the
answers; infra/tools/report_preflight.py prints them and writes the JSON report.

- A reservation rung: Compute Engine v1 `reservations.get` (and `reservationBlocks.get`,
  `reservationSubBlocks.get` for a block or sub-block path): it exists in the pool's zone, its
  `specificReservation.instanceProperties.machineType` is the pool's, and how many whole slices
  are free now: (count - inUseCount) // hosts per slice; a block's or sub-block's own
  count/inUseCount and `healthInfo` (healthStatus, degraded hosts). Field names: the vendored
  discovery document, infra/schemas/gce-compute-v1/compute.v1.reservations.json.
- A spot, on-demand, flex-start or queued rung: the region's TPU chips quota from Cloud Quotas
  (`cloudquotas.googleapis.com/v1` quotaInfos of compute.googleapis.com). Which quota: the
  Compute v1 discovery document's `Quota.metric` enum names TPU quotas for v4 and v5e only, none
  for v6e or TPU7x, so park looks for the quota whose metric names the generation (TPU_TOKENS)
  and says which one it read; none found: "quota name unknown". Spot, flex-start and queued
  draw on the preemptible quota (GKE's flex-start and queued-provisioning docs), on-demand on
  the other. Cloud Quotas carries the limit, not the usage: the headroom is at most the limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.resolve import StackPlan
    from infra.resolve.types import PoolPlan, RungPlan

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
COMPUTE = "https://compute.googleapis.com/compute/v1/"
QUOTAS = "https://cloudquotas.googleapis.com/v1/"
QUOTA_SERVICE = "compute.googleapis.com"
REPORT_KIND = "park-preflight"
# What no Google API can promise; said in every report.
PROMISE = (
    "No Google API promises N machines in a zone at a given moment. Free reservation capacity "
    "(count - in use, whole slices) is certain while it stays free; quota headroom is only "
    "permission to ask: spot, on-demand, flex-start and queued capacity can still be out of "
    "stock in the zone."
)
# The part of a quota's metric that names a TPU generation (lowercase, letters and digits).
TPU_TOKENS = {"v6e": "v6e", "tpu7x": "tpu7x"}
PREEMPTIBLE_RUNGS = ("spot", "flex-start", "queued")


@dataclass(frozen=True)
class Finding:
    """One check: a rung's reservation, block, sub-block or quota, or a tool of this machine."""

    where: str  # "POOL/TAG" for a rung, "machine" for this machine
    check: str  # reservation, block, sub-block, quota, a tool's name, credentials
    status: str  # ok, warn, fail, unknown
    detail: str
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """One API answer: the HTTP status and the decoded body ({} when none)."""

    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class ReservationRef:
    project: str
    name: str
    block: str | None = None
    sub_block: str | None = None

    def urls(self, zone: str) -> dict[str, str]:
        """The `get` URL of each level the path names (discovery: flatPath of each method)."""
        base = f"{COMPUTE}projects/{self.project}/zones/{zone}/reservations/{self.name}"
        urls = {"reservation": base}
        if self.block:
            urls["block"] = f"{base}/reservationBlocks/{self.block}"
            if self.sub_block:
                urls["sub-block"] = f"{urls['block']}/reservationSubBlocks/{self.sub_block}"
        return urls


_PATH = re.compile(
    r"^(?:projects/(?P<project>[^/]+)/reservations/)?(?P<name>[^/]+)"
    r"(?:/reservationBlocks/(?P<block>[^/]+)(?:/reservationSubBlocks/(?P<sub>[^/]+))?)?$"
)


def parse_reservation(value: str, project: str) -> ReservationRef:
    """A rung's reservation (validated by infra.rules.grammar) as project, name, block, sub."""
    found = _PATH.match(value)
    if found is None:
        raise ValueError(f"not a reservation path: {value!r}")
    return ReservationRef(found["project"] or project, found["name"], found["block"], found["sub"])


def quota_url(project: str) -> str:
    return f"{QUOTAS}projects/{project}/locations/global/services/{QUOTA_SERVICE}/quotaInfos"


def _int(value: Any) -> int:
    """An API count: int64 fields come as strings."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _last(url: Any) -> str:
    return str(url or "").rstrip("/").rsplit("/", 1)[-1]


def _unreadable(answer: Answer, what: str, permission: str) -> tuple[str, str]:
    if answer.status == 404:
        return FAIL, f"no {what} (404): not in this project and zone, or misspelt"
    if answer.status == 403:
        return UNKNOWN, f"cannot read the {what} (403): needs {permission}"
    message = str((answer.body.get("error") or {}).get("message", "")) if answer.body else ""
    return UNKNOWN, f"cannot read the {what} (HTTP {answer.status}) {message}".rstrip()


def free_slices(count: int, in_use: int, hosts: int) -> int:
    """Whole slices the free hosts make: a multi-host slice needs every one of its hosts."""
    return max(count - in_use, 0) // max(hosts, 1)


def _capacity(pool: PoolPlan, count: int, in_use: int, what: str) -> tuple[str, str, dict]:
    hosts, need = pool.slice.hosts, pool.slices
    free = free_slices(count, in_use, hosts)
    facts = {"count": count, "in_use": in_use, "hosts_per_slice": hosts, "free_slices": free}
    facts["slices_needed"] = need
    said = f"{free} of {need} slice(s) free ({count - in_use} of {count} hosts, {hosts}/slice)"
    if count // max(hosts, 1) < need:
        return FAIL, f"{what} too small: {said}", facts
    if free < need:
        return WARN, f"{what} in use: {said}", facts
    return OK, said, facts


def reservation_findings(
    pool: PoolPlan, rung: RungPlan, ref: ReservationRef, zone: str, answers: Mapping[str, Answer]
) -> list[Finding]:
    """The reservation, then its block and sub-block when the path names them."""
    where = f"{pool.name}/{rung.tag}"
    found: list[Finding] = []
    answer = answers["reservation"]
    if answer.status != 200:
        status, detail = _unreadable(answer, f"reservation {ref.name}", "compute.reservations.get")
        return [Finding(where, "reservation", status, detail, {"project": ref.project})]
    body = answer.body
    sku = body.get("specificReservation") or {}
    machine = (sku.get("instanceProperties") or {}).get("machineType", "")
    problems = []
    if _last(body.get("zone")) != zone:
        problems.append(f"in zone {_last(body.get('zone'))}, the pool is in {zone}")
    if machine != pool.spec.machine_type:
        problems.append(f"machine type {machine or 'none'}, the pool's is {pool.spec.machine_type}")
    if problems:
        return [Finding(where, "reservation", FAIL, "; ".join(problems), {"machine": machine})]
    status, detail, facts = _capacity(
        pool, _int(sku.get("count")), _int(sku.get("inUseCount")), "reservation"
    )
    if body.get("status", "READY") != "READY":
        status, detail = WARN if status == OK else status, f"{detail}; status {body['status']}"
    found.append(Finding(where, "reservation", status, detail, facts))
    for level in ("block", "sub-block"):
        if level in answers:
            found.append(_block_finding(pool, where, level, answers[level]))
    return found


def _block_finding(pool: PoolPlan, where: str, level: str, answer: Answer) -> Finding:
    if answer.status != 200:
        permission = (
            "compute.reservationBlocks.get"
            if level == "block"
            else ("compute.reservationSubBlocks.get")
        )
        status, detail = _unreadable(answer, f"reservation {level}", permission)
        return Finding(where, level, status, detail)
    resource = answer.body.get("resource") or {}
    count, in_use = _int(resource.get("count")), _int(resource.get("inUseCount"))
    status, detail, facts = _capacity(pool, count, in_use, level)
    health = resource.get("healthInfo") or {}
    facts = {**facts, "health": health.get("healthStatus", "HEALTH_STATUS_UNSPECIFIED")}
    if health.get("healthStatus") == "DEGRADED":
        degraded = _int(health.get("degradedHostCount")) + _int(health.get("degradedSubBlockCount"))
        healthy = _int(health.get("healthyHostCount"))
        facts |= {"degraded": degraded, "healthy_hosts": healthy}
        need_hosts = pool.slice.hosts * pool.slices
        bad = level == "sub-block" and healthy < need_hosts
        status = FAIL if bad else (WARN if status == OK else status)
        detail = f"{detail}; DEGRADED ({degraded} degraded, {healthy} healthy hosts)"
    return Finding(where, level, status, detail, facts)


def _compact(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def matching_quotas(infos: list[Mapping[str, Any]], generation: str, preemptible: bool) -> list:
    """The QuotaInfos whose metric names the generation's TPUs, preemptible or not."""
    token = TPU_TOKENS.get(generation)
    if token is None:
        return []
    found = []
    for info in infos:
        name = _compact(str(info.get("metric", "")))
        if "tpu" in name and token in name and ("preemptible" in name) == preemptible:
            found.append(info)
    return found


def region_value(info: Mapping[str, Any], region: str) -> int | None:
    """The quota's value in `region`: its dimensionsInfos, most specific first (the API's
    order), the first whose region is `region` or whose applicableLocations hold it."""
    for entry in info.get("dimensionsInfos") or []:
        dims = entry.get("dimensions") or {}
        applies = dims.get("region") == region or (
            "region" not in dims and region in (entry.get("applicableLocations") or [])
        )
        if applies:
            return _int((entry.get("details") or {}).get("value"))
    return None


def quota_finding(
    pool: PoolPlan, rung: RungPlan, region: str, infos: Answer, truncated: bool = False
) -> Finding:
    """The region's TPU chips quota for a spot, on-demand, flex-start or queued rung."""
    where = f"{pool.name}/{rung.tag}"
    if infos.status != 200:
        status, detail = _unreadable(infos, "quotas", "cloudquotas.quotas.get")
        return Finding(where, "quota", status, detail)
    preemptible = rung.capacity in PREEMPTIBLE_RUNGS
    kind = "preemptible" if preemptible else "on-demand"
    generation = pool.slice.generation.name
    matches = matching_quotas(list(infos.body.get("quotaInfos") or []), generation, preemptible)
    need = pool.total_chips
    facts: dict[str, Any] = {"quota_kind": kind, "chips_needed": need, "region": region}
    if len(matches) != 1:
        names = ", ".join(str(m.get("metric")) for m in matches) or "none"
        more = "; the list was cut short" if truncated else ""
        detail = f"{kind} {generation} quota name unknown (matched: {names}){more}"
        return Finding(where, "quota", UNKNOWN, detail, facts | {"matched": names})
    info = matches[0]
    limit = region_value(info, region)
    facts |= {"metric": info.get("metric"), "quota_id": info.get("quotaId"), "limit": limit}
    if limit is None:
        return Finding(where, "quota", UNKNOWN, f"{info.get('metric')}: none for {region}", facts)
    said = f"{info.get('quotaId')}: {limit} chips in {region}, {need} needed"
    if limit < need:
        return Finding(
            where, "quota", FAIL, f"{'zero quota' if limit == 0 else 'short'}: {said}", facts
        )
    return Finding(where, "quota", OK, f"{said} (in use not read: headroom <= limit)", facts)


# ---------------------------------------------------------------------------------------------
# This machine


def adc_file(env: Mapping[str, str], home: Path) -> Path:
    """Where google-auth's application-default credentials are, without asking a metadata
    server: GOOGLE_APPLICATION_CREDENTIALS, else gcloud's file (CLOUDSDK_CONFIG moves it)."""
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return Path(env["GOOGLE_APPLICATION_CREDENTIALS"])
    config = Path(env["CLOUDSDK_CONFIG"]) if env.get("CLOUDSDK_CONFIG") else home / ".config/gcloud"
    return config / "application_default_credentials.json"


TOOLS = (
    ("pulumi", "the Pulumi CLI runs `pulumi up`"),
    ("gcloud", "gcloud logs you in and fetches the cluster's credentials"),
    ("gke-gcloud-auth-plugin", "kubectl and the Kubernetes provider reach GKE through it"),
)


def machine_findings(
    which: Callable[[str], str | None],
    env: Mapping[str, str],
    home: Path,
    is_file: Callable[[Path], bool],
    builds_images: bool,
) -> list[Finding]:
    """What the deployer's machine needs, looked up locally (as `sky check` does)."""
    found = []
    for tool, why in TOOLS:
        path = which(tool)
        found.append(Finding("machine", tool, OK if path else FAIL, path or f"not on PATH: {why}"))
    if not builds_images:
        found.append(Finding("machine", "docker", OK, "not needed: every image is pinned"))
    elif not which("docker"):
        found.append(Finding("machine", "docker", FAIL, "not on PATH: `up` builds the images"))
    elif env.get("DOCKER_BUILDKIT") == "0":
        found.append(Finding("machine", "docker", FAIL, "DOCKER_BUILDKIT=0: `up` needs BuildKit"))
    else:
        detail = "on PATH; BuildKit is Docker Engine 23+'s builder (the daemon is not asked)"
        found.append(Finding("machine", "docker", OK, detail))
    adc = adc_file(env, home)
    has = is_file(adc)
    login = "run `gcloud auth application-default login`"
    detail = str(adc) if has else f"no {adc}: {login}"
    found.append(Finding("machine", "credentials", OK if has else FAIL, detail))
    return found


# ---------------------------------------------------------------------------------------------
# The whole stack


def rung_requests(plan: StackPlan) -> list[tuple[PoolPlan, RungPlan, ReservationRef | None]]:
    """Each rung of each TPU pool, with its reservation when it has one."""
    project = plan.spec.project
    return [
        (pool, rung, parse_reservation(rung.reservation, project) if rung.reservation else None)
        for pool in plan.tpu_pools
        for rung in pool.rungs
    ]


def worst(findings: list[Finding]) -> str:
    order = (OK, UNKNOWN, WARN, FAIL)
    return max((f.status for f in findings), key=order.index, default=OK)


def report(plan: StackPlan, findings: list[Finding]) -> dict[str, Any]:
    """The JSON report: the stack, every finding, and what no API promises."""
    return {
        "kind": REPORT_KIND,
        "stack": plan.stack,
        "project": plan.spec.project,
        "region": plan.spec.region,
        "zone": plan.spec.zone,
        "verdict": worst(findings),
        "findings": [asdict(f) for f in findings],
        "promise": PROMISE,
        "quota_names": (
            "Cloud Quotas quotaInfos of compute.googleapis.com whose metric names the TPU "
            f"generation ({', '.join(TPU_TOKENS.values())}; 'preemptible' for spot, "
            "flex-start, queued); the Compute v1 discovery document names none for v6e or TPU7x"
        ),
    }


def gather(
    plan: StackPlan,
    get: Callable[[str], Answer],
    list_all: Callable[[str, str], tuple[Answer, bool]],
) -> list[Finding]:
    """Every rung's findings, asking through `get` and `list_all` (the reader, or recorded
    answers in the tests); the quota list is read once, only when a rung needs it."""
    found: list[Finding] = []
    quotas: tuple[Answer, bool] | None = None
    for pool, rung, ref in rung_requests(plan):
        if ref is not None:
            urls = ref.urls(plan.spec.zone)
            answers = {"reservation": get(urls.pop("reservation"))}
            if answers["reservation"].status == 200:  # its block and sub-block, if any
                answers |= {level: get(url) for level, url in urls.items()}
            found += reservation_findings(pool, rung, ref, plan.spec.zone, answers)
            continue
        if quotas is None:
            quotas = list_all(quota_url(plan.spec.project), "quotaInfos")
        found.append(quota_finding(pool, rung, plan.spec.region, *quotas))
    return found
