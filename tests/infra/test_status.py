"""`park status STACK` (issue 38, item 5): why each workload of a deployed stack runs or waits.

The pure half (infra/tools/status.py) is replayed on recorded API responses
(tests/data/status/*.yaml), each checked against its kind's schema first (the vendored CRDs,
strict, and Kubernetes' own for pods and events), so a fixture with a field the API does not
have fails here. The reader (infra/tools/status_read.py) is run against a loopback HTTP server
answering from the same recordings; the CLI is run without credentials, with a refused token
and with a cluster that does not answer.
"""

from __future__ import annotations

import copy
import json
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from infra.tools import report_status
from infra.tools.cli import app, command_names
from infra.tools.status import (
    ABSENT,
    EVICTED,
    FAILED,
    HEALTHY,
    PENDING,
    RUNNING,
    STARTING,
    SUCCEEDED,
    UNHEALTHY,
    WAITING,
    Observed,
    explain,
    provisioning,
)
from infra.tools.status_read import ClusterError, Reading, read
from tests.infra.goldens import golden_manifests
from tests.infra.status_fixtures import (
    FakeCluster,
    golden_targets,
    kubeconfig,
    load,
    objects,
    observed,
    problems,
    scenarios,
)

runner = CliRunner()

# scenario -> (state, words its why must hold)
EXPECTED = {
    "rayjob-admitted-running": (RUNNING, ("running", "park-train-v6e-16")),
    "rayjob-waiting-for-quota": (WAITING, ("quota", "16 more needed")),
    "rayjob-dws-pending": (WAITING, ("park-dws", "not provisioned yet")),
    "rayjob-provisioning-failed": (FAILED, ("park-dws", "rejected", "ZONE_RESOURCE_POOL")),
    "rayjob-pods-stockout": (PENDING, ("stockout", "GCE out of resources")),
    "rayjob-evicted-pods-ready-timeout": (EVICTED, ("PodsReadyTimeout", "requeued 1")),
    "rayservice-healthy": (HEALTHY, ("1 app(s) running",)),
    "rayservice-unhealthy": (UNHEALTHY, ("DEPLOY_FAILED", "KV cache")),
}


def test_every_recorded_scenario_is_expected():
    assert sorted(EXPECTED) == scenarios()


# ---- the recordings are what the APIs return --------------------------------------------------


@pytest.mark.parametrize("scenario", scenarios())
def test_recorded_responses_match_the_api_schemas(scenario):
    recorded = load(scenario)
    found = objects(recorded)
    assert found
    assert [p for obj in found for p in problems(obj)] == []


@pytest.mark.parametrize(
    ("scenario", "kind", "path", "wrong"),
    [
        ("rayjob-admitted-running", "RayJob", ("status",), "jobDeployStatus"),
        ("rayjob-dws-pending", "Workload", ("status", "admissionChecks", 0), "status"),
        ("rayjob-dws-pending", "ProvisioningRequest", ("status", "conditions", 0), "kind"),
        ("rayjob-pods-stockout", "Event", (), "involvedObjects"),
        ("rayservice-healthy", "RayService", ("status",), "serviceState"),
    ],
)
def test_a_wrong_field_name_fails_the_schema_check(scenario, kind, path, wrong):
    obj = copy.deepcopy(next(o for o in objects(load(scenario)) if o["kind"] == kind))
    node: Any = obj
    for step in path:
        node = node[step]
    node[wrong] = "x"
    assert problems(obj), (kind, wrong)


# ---- what each scenario says --------------------------------------------------------------------


@pytest.mark.parametrize("scenario", scenarios())
def test_each_scenario_says_its_state_and_why(scenario):
    state, words = EXPECTED[scenario]
    found = explain(observed(load(scenario)))
    assert found.state == state, found
    for word in words:
        assert word in found.why, (word, found.why)
    assert found.evidence


def test_targets_are_the_renders_workloads_with_their_queues():
    queued = {(t.kind, t.name): t for t in golden_targets("queued")}
    assert queued[("RayJob", "park-train")].queue == "train-v6e-16"
    assert queued[("RayService", "park-serve")].queue is None
    assert all(t.namespace == "park" for t in queued.values())
    assert [t.name for t in golden_targets("rl")] == ["park-rl"]
    assert golden_targets("dev")[0].queue is None


def _with_event_message(message: str) -> Observed:
    recorded = load("rayjob-pods-stockout")
    for event in recorded["responses"]["events"]["items"]:
        if event["reason"] == "FailedScaleUp":
            event["message"] = message
    return observed(recorded)


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (
            "Node scale up in zones us-east5-b associated with this pod failed: GCE quota "
            "exceeded. Pod is at risk of not being scheduled.",
            "quota is exhausted",
        ),
        (
            "Instance creation failed: Quota 'TPUS_PER_TPU_FAMILY' exceeded. Limit: 0.0 in "
            "region us-east5.",
            "quota is exhausted",
        ),
        (
            "The zone 'projects/p/zones/us-east5-b' does not have enough resources available "
            "to fulfill the request. (ZONE_RESOURCE_POOL_EXHAUSTED)",
            "stockout",
        ),
        (
            "Node scale up failed: specific reservation 'v6e-rsv' does not match the node "
            "pool's machine type",
            "reservation",
        ),
    ],
)
def test_the_cloud_s_answer_names_the_cause(message, words):
    found = explain(_with_event_message(message))
    assert found.state == PENDING
    assert words in found.why, found.why


def test_without_the_cloud_s_answer_the_scheduler_s_is_said():
    recorded = load("rayjob-pods-stockout")
    events = recorded["responses"]["events"]["items"]
    events[:] = [e for e in events if e["reason"] == "FailedScheduling"]
    assert "no node fits it" in explain(observed(recorded)).why
    events[:] = []
    assert "unschedulable: 0/3 nodes" in explain(observed(recorded)).why


def test_a_scale_up_under_way_is_starting_not_pending():
    recorded = load("rayjob-pods-stockout")
    events = recorded["responses"]["events"]["items"]
    events[:] = [e for e in events if e["reason"] == "TriggeredScaleUp"]
    found = explain(observed(recorded))
    assert (found.state, found.why.split(": ")[1]) == (STARTING, "a node pool is scaling up for it")


def test_a_retried_provisioning_failure_is_waiting_not_failed():
    recorded = load("rayjob-provisioning-failed")
    workload = recorded["responses"]["workloads"]["items"][0]
    workload["spec"]["active"] = True
    check = workload["status"]["admissionChecks"][0]
    check.update(state="Retry", message="Retrying after failure: " + check["message"])
    workload["status"]["conditions"] = [
        {**c, "status": "True", "reason": "QuotaReserved"} if c["type"] == "QuotaReserved" else c
        for c in workload["status"]["conditions"]
        if c["type"] != "Evicted"
    ]
    found = explain(observed(recorded))
    assert found.state == WAITING
    assert "Kueue retries" in found.why and "failed" in found.why


@pytest.mark.parametrize(
    ("kind", "state"),
    [("BookingExpired", "booking expired"), ("CapacityRevoked", "capacity revoked")],
)
def test_provisioning_request_states(kind, state):
    request = {
        "metadata": {"name": "wl-park-dws-1"},
        "status": {
            "conditions": [
                {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": ""},
                {"type": kind, "status": "True", "reason": kind, "message": "nodes went away"},
            ]
        },
    }
    assert provisioning(request) == (state, "nodes went away")
    assert provisioning(None)[0] == "not created yet"


def test_a_ladder_rung_is_named_where_kueue_admitted_it():
    recorded = load("rayjob-admitted-running")
    status = recorded["responses"]["workloads"]["items"][0]["status"]
    status["admission"]["podSetAssignments"][1]["flavors"]["google.com/tpu"] = "park-train-spot"
    assert "on flavor park-train-spot" in explain(observed(recorded)).why


def test_a_queued_job_without_a_workload_points_at_kueue():
    recorded = load("rayjob-waiting-for-quota")
    recorded["responses"]["workloads"]["items"] = []
    found = explain(observed(recorded))
    assert found.state == WAITING
    assert "no Kueue Workload" in found.why and "train-v6e-16" in found.why


@pytest.mark.parametrize(
    ("status", "state", "word"),
    [
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, SUCCEEDED, "succeeded"),
        (
            {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"},
            FAILED,
            "AppFailed",
        ),
    ],
)
def test_kuberay_s_end_of_a_job(status, state, word):
    recorded = load("rayjob-admitted-running")
    recorded["responses"]["resource"]["status"] = status
    found = explain(observed(recorded))
    assert (found.state, word in found.why) == (state, True), found


def test_a_missing_workload_is_absent():
    recorded = load("rayservice-healthy")
    recorded["responses"]["resource"] = None
    found = explain(observed(recorded))
    assert found.state == ABSENT and "not found" in found.why


def test_a_container_that_cannot_start_is_said():
    recorded = load("rayservice-unhealthy")
    resource = recorded["responses"]["resource"]
    resource["status"]["activeServiceStatus"]["applicationStatuses"] = {}
    pod = recorded["responses"]["pods"]["items"][0]
    pod["status"]["containerStatuses"] = [
        {"name": "ray-head", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "x"}}}
    ]
    found = explain(observed(recorded))
    assert "ImagePullBackOff" in found.why, found


# ---- output -------------------------------------------------------------------------------------


def _reading() -> Reading:
    return Reading("gke_p_us-east5-b_park-queued", tuple(observed(load(s)) for s in scenarios()))


def test_the_table_fits_80_columns_and_says_each_state():
    out = Console(width=200, record=True, color_system=None)
    reading = _reading()
    statuses = tuple(explain(o) for o in reading.observed)
    report_status.table("queued", reading, statuses, out)
    text = out.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    for state, _ in EXPECTED.values():
        assert state in text


def test_the_json_report_holds_every_workload():
    reading = _reading()
    statuses = tuple(explain(o) for o in reading.observed)
    shown = json.loads(json.dumps(report_status.as_json("queued", reading, statuses)))
    assert shown["context"] == reading.context
    assert [w["state"] for w in shown["workloads"]] == [s.state for s in statuses]
    assert all(w["why"] and w["evidence"] for w in shown["workloads"])


# ---- the reader, against a cluster on loopback --------------------------------------------------


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    servers: list[FakeCluster] = []

    def start(names: list[str], status: int = 200) -> FakeCluster:
        fake = FakeCluster([load(n) for n in names], status)
        servers.append(fake)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", fake.url)))
        return fake

    yield start
    for fake in servers:
        fake.close()


def test_the_reader_reads_what_the_pure_half_needs(cluster):
    fake = cluster(["rayjob-dws-pending", "rayservice-healthy"])
    reading = read(golden_targets("queued"))
    assert reading.context == "fake"
    found = {o.target.kind: explain(o) for o in reading.observed}
    assert found["RayJob"].state == WAITING and "park-dws" in found["RayJob"].why
    assert found["RayService"].state == HEALTHY
    lists = [(path, query) for path, query in fake.requests if not path.startswith("/apis/ray")]
    assert lists and all(query.get("limit") for _, query in lists), fake.requests
    assert any(p.endswith("/workloads") for p, _ in lists)
    # the service is not queued: its Kueue objects are not asked for twice, nor for it
    assert sum(p.endswith("/workloads") for p, _ in lists) == 1


def test_the_reader_asks_for_events_of_unscheduled_pods_only(cluster):
    fake = cluster(["rayjob-pods-stockout"])
    (reading,) = read(golden_targets("dev")[:1]).observed
    asked = [q["fieldSelector"][0] for p, q in fake.requests if p.endswith("/events")]
    assert asked == [
        "involvedObject.kind=Pod,involvedObject.name=park-train-5lq9v-v6e-8-worker-k2x7p"
    ]
    assert explain(reading).state == PENDING


def _stub_render(monkeypatch, stack: str) -> None:
    """`park status` reads the render's workloads: the committed golden render stands in for
    re-rendering the stack (seconds of CPU) here."""
    docs = list(golden_manifests(stack).values())
    rendered = SimpleNamespace(plan=SimpleNamespace(stack=stack), manifests=lambda: docs)
    monkeypatch.setattr("infra.tools.cli._rendered", lambda *args: rendered)


def park(*args: str):
    return runner.invoke(app, ["status", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_park_status_is_a_command():
    assert "status" in command_names()


def test_park_status_json_through_the_cli(cluster, monkeypatch):
    cluster(["rayjob-provisioning-failed", "rayservice-healthy"])
    _stub_render(monkeypatch, "queued")
    result = park("queued", "--json")
    assert result.exit_code == 1, result.output  # a failed workload
    shown = json.loads(result.stdout)
    assert {w["name"]: w["state"] for w in shown["workloads"]} == {
        "park-train": FAILED,
        "park-serve": HEALTHY,
    }


def _one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_without_a_kubeconfig_it_says_so_in_one_line(tmp_path, monkeypatch):
    _stub_render(monkeypatch, "dev")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    line = _one_line_error(park("dev"))
    assert "no usable kubeconfig" in line and "get-credentials" in line


def test_an_unknown_context_names_the_known_ones(cluster, monkeypatch):
    cluster(["rayservice-healthy"])
    _stub_render(monkeypatch, "dev")
    line = _one_line_error(park("dev", "--context", "gke_other"))
    assert "'gke_other'" in line and "fake" in line


def test_refused_credentials_are_said_in_one_line(cluster, monkeypatch):
    cluster(["rayservice-healthy"], status=401)
    _stub_render(monkeypatch, "dev")
    assert "refused the credentials (401)" in _one_line_error(park("dev"))


def test_a_cluster_that_does_not_answer_is_given_up_on(tmp_path, monkeypatch):
    silent = socket.socket()  # listens, never answers: the read timeout ends the wait
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", url)))
        started = time.monotonic()
        with pytest.raises(ClusterError, match="cannot reach the cluster"):
            read(golden_targets("dev"), timeout_s=0.5)
        assert time.monotonic() - started < 5
    finally:
        silent.close()


def test_park_status_names_the_render_s_workloads_in_its_help():
    result = runner.invoke(app, ["status", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "--context" in result.output and "--json" in result.output


def test_a_kubeconfig_path_list_is_read(tmp_path, monkeypatch):
    fake = FakeCluster([load("rayservice-healthy")])
    try:
        path = kubeconfig(tmp_path / "second", fake.url)
        monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
        reading = read(golden_targets("dev")[1:])
        assert explain(reading.observed[0]).state == HEALTHY
    finally:
        fake.close()


def test_without_the_kubernetes_client_it_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes: ImportError
    with pytest.raises(ClusterError, match=r"park-gke\[cluster\]"):
        read(golden_targets("dev"))


def test_unread_kueue_objects_leave_kuberay_s_word():
    recorded = load("rayjob-admitted-running")
    recorded["responses"]["workloads"] = None
    found = explain(observed(recorded))
    assert (found.state, found.why) == (RUNNING, "the job is running")
    assert any("not read" in line for line in found.evidence)


def test_park_status_table_through_the_cli(cluster, monkeypatch):
    cluster(["rayjob-pods-stockout", "rayservice-healthy"])
    _stub_render(monkeypatch, "dev")
    result = park("dev")
    assert result.exit_code == 0, result.output  # pending and healthy: nothing failed
    assert "pending" in result.output and "healthy" in result.output
    assert "stockout" in result.output and "context fake" in result.output
