"""`park preflight`: findings from recorded API answers (tests/data/preflight/), each answer
held to its API's schema (a misspelt field fails), the reader's URLs held to the discovery
document, this machine's checks, and the command end to end with no credentials and no network.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.tools import gke_api, preflight, preflight_read
from infra.tools.cli import app
from infra.tools.preflight import FAIL, OK, UNKNOWN, WARN, Answer
from tests.conftest import ROOT, STACKS_DIR

DATA = ROOT / "tests" / "data" / "preflight"
COMPUTE = ROOT / "infra" / "schemas" / "gce-compute-v1" / "compute.v1.reservations.json"
QUOTAS = DATA / "cloudquotas.v1.quotainfo.schema.json"
SCHEMA_OF = {
    "reservation": "Reservation",
    "block": "ReservationBlocksGetResponse",
    "sub-block": "ReservationSubBlocksGetResponse",
    "quota-infos": "ListQuotaInfosResponse",
}
runner = CliRunner()


def _load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _schema_problems(name: str, body: dict) -> list[str]:
    kind = next(s for prefix, s in SCHEMA_OF.items() if name.startswith(prefix))
    source = QUOTAS if kind == "ListQuotaInfosResponse" else COMPUTE
    schemas = json.loads(source.read_text())["schemas"]
    return gke_api._problems(body, {"$ref": kind}, kind, schemas)


# Every recorded answer but the 404's error body
RECORDED = sorted(p.stem for p in DATA.glob("*.json") if p.stem.startswith(tuple(SCHEMA_OF)))


@pytest.mark.parametrize("name", RECORDED)
def test_each_recorded_answer_holds_to_its_apis_schema(name):
    assert _schema_problems(name, _load(name)) == []


def test_a_misspelt_field_fails_the_schema():
    body = _load("sub-block-healthy")
    body["resource"]["healthInfo"]["unhealthyHostCount"] = 1
    assert any("unhealthyHostCount" in p for p in _schema_problems("sub-block", body))
    quotas = _load("quota-infos")
    quotas["quotaInfos"][0]["dimensionsInfos"][0]["details"]["quotaValue"] = "1"
    assert any("quotaValue" in p for p in _schema_problems("quota-infos", quotas))


def test_the_reader_asks_the_discovery_documents_urls():
    doc = json.loads(COMPUTE.read_text())
    ref = preflight.parse_reservation(
        "projects/p-1/reservations/r/reservationBlocks/b/reservationSubBlocks/s", "other"
    )
    urls = ref.urls("z")
    root = doc["rootUrl"] + doc["servicePath"]
    method = {
        "reservation": "reservations",
        "block": "reservationBlocks",
        "sub-block": "reservationSubBlocks",
    }
    values = {
        "{project}": "p-1",
        "{zone}": "z",
        "{reservation}": "r",
        "{reservationsId}": "r",
        "{reservationBlock}": "b",
        "{reservationBlocksId}": "b",
        "{reservationSubBlock}": "s",
    }
    for level, url in urls.items():
        path = doc["resources"][method[level]]["methods"]["get"]["flatPath"]
        for key, value in values.items():
            path = path.replace(key, value)
        assert url == root + path, level
    assert preflight.parse_reservation("r", "mine") == preflight.ReservationRef("mine", "r")


# ---------------------------------------------------------------------------------------------
# prod: train-v6e-16 is a sub-block rung then queued; serve-v6e-16 on-demand, 2 slices of 4 hosts


def _plan(stack: str = "prod"):
    from infra.stack import from_file

    return from_file(STACKS_DIR / f"Pulumi.{stack}.yaml", stack, None)


def _replay(reservation="reservation", block="block", sub="sub-block-healthy", quota="quota-infos"):
    asked: list[str] = []

    def get(url: str) -> Answer:
        asked.append(url)
        name = sub if "reservationSubBlocks/" in url else block if "Blocks/" in url else reservation
        return Answer(404 if name == "not-found" else 200, _load(name))

    def list_all(url: str, key: str) -> tuple[Answer, bool]:
        asked.append(url)
        return Answer(200, _load(quota)), False

    return get, list_all, asked


def _by(findings, where: str, check: str):
    return next(f for f in findings if f.where == where and f.check == check)


def test_a_free_healthy_sub_block_and_quota_pass():
    get, list_all, asked = _replay()
    found = preflight.gather(_plan(), get, list_all)
    rsv = _by(found, "train-v6e-16/rsv", "reservation")
    assert rsv.status == OK and rsv.facts["free_slices"] == 2  # 8 free hosts, 4 per slice
    sub = _by(found, "train-v6e-16/rsv", "sub-block")
    assert sub.status == OK and sub.facts["health"] == "HEALTHY"
    assert _by(found, "train-v6e-16/dws", "quota").status == OK
    serve = _by(found, "serve-v6e-16/od", "quota")
    assert serve.status == OK and serve.facts["chips_needed"] == 32 and serve.facts["limit"] == 64
    assert serve.facts["metric"] == "compute.googleapis.com/tpu_v6e_slice"
    assert _by(found, "train-v6e-16/dws", "quota").facts["quota_kind"] == "preemptible"
    assert sum("quotaInfos" in u for u in asked) == 1  # the quota list read once


def test_an_unhealthy_sub_block_fails():
    get, list_all, _ = _replay(sub="sub-block-degraded")
    sub = _by(preflight.gather(_plan(), get, list_all), "train-v6e-16/rsv", "sub-block")
    assert sub.status == FAIL and "DEGRADED" in sub.detail and sub.facts["healthy_hosts"] == 3


def test_a_reservation_too_small_the_wrong_machine_type_or_zone_fails():
    get, list_all, _ = _replay(reservation="reservation-too-small")
    rsv = _by(preflight.gather(_plan(), get, list_all), "train-v6e-16/rsv", "reservation")
    assert rsv.status == FAIL and "too small" in rsv.detail and rsv.facts["free_slices"] == 0
    get, list_all, _ = _replay(reservation="reservation-wrong-machine")
    rsv = _by(preflight.gather(_plan(), get, list_all), "train-v6e-16/rsv", "reservation")
    assert rsv.status == FAIL and "ct6e-standard-8t" in rsv.detail
    get, list_all, _ = _replay(reservation="reservation-wrong-zone")
    rsv = _by(preflight.gather(_plan(), get, list_all), "train-v6e-16/rsv", "reservation")
    assert rsv.status == FAIL and "us-east5-a" in rsv.detail


def test_a_reservation_in_use_is_a_warning_not_a_failure():
    pool = _plan().pool("train-v6e-16")
    assert preflight._capacity(pool, 8, 6, "reservation")[0] == WARN
    assert preflight.free_slices(8, 3, 4) == 1


def test_a_missing_reservation_fails_and_its_blocks_are_not_asked():
    get, list_all, asked = _replay(reservation="not-found")
    found = preflight.gather(_plan(), get, list_all)
    rsv = _by(found, "train-v6e-16/rsv", "reservation")
    assert rsv.status == FAIL and "404" in rsv.detail
    assert not any("reservationBlocks" in u for u in asked)
    assert preflight.worst(found) == FAIL


def test_zero_quota_fails_and_an_unknown_name_is_said():
    get, list_all, _ = _replay(quota="quota-infos-zero")
    found = preflight.gather(_plan(), get, list_all)
    serve = _by(found, "serve-v6e-16/od", "quota")
    assert serve.status == FAIL and "zero quota" in serve.detail
    ironwood = preflight.gather(_plan("ironwood"), *_replay()[:2])
    queued = _by(ironwood, "train-7x/dws", "quota")  # the recording has no TPU7x quota
    assert queued.status == UNKNOWN and "quota name unknown" in queued.detail


def test_the_report_says_what_no_api_promises():
    get, list_all, _ = _replay()
    data = preflight.report(_plan(), preflight.gather(_plan(), get, list_all))
    assert data["kind"] == "park-preflight" and data["zone"] == "us-east5-b"
    assert "No Google API promises N machines in a zone" in data["promise"]
    assert "permission" in data["promise"]


# ---------------------------------------------------------------------------------------------
# This machine


def test_the_machines_tools_and_credentials(tmp_path):
    on_path = {"pulumi": "/bin/pulumi", "gcloud": "/bin/gcloud", "docker": "/bin/docker"}
    found = preflight.machine_findings(
        on_path.get, {"DOCKER_BUILDKIT": "0"}, tmp_path, Path.is_file, builds_images=True
    )
    status = {f.check: f.status for f in found}
    assert status == {
        "pulumi": OK,
        "gcloud": OK,
        "gke-gcloud-auth-plugin": FAIL,
        "docker": FAIL,
        "credentials": FAIL,
    }
    adc = tmp_path / "adc.json"
    adc.write_text("{}")
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(adc)}
    found = preflight.machine_findings(on_path.get, env, tmp_path, Path.is_file, False)
    assert {f.check: f.status for f in found}["credentials"] == OK
    assert {f.check: f.status for f in found}["docker"] == OK  # nothing to build


# ---------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No credentials anywhere, no socket beyond loopback, and google.auth.default (which
    asks a metadata server) never called."""
    import google.auth

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    real = socket.socket.connect

    def connect(sock, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network: {address}")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: pytest.fail("ADC probed"))
    return tmp_path


def test_without_credentials_it_ends_with_one_line_and_exit_1(no_network):
    result = runner.invoke(app, ["preflight", "prod", "--out", str(no_network / "o")])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    last = result.output.strip().splitlines()[-1]
    assert "no application-default credentials" in last and "gcloud auth" in last
    assert not (no_network / "o").exists()


def test_with_recorded_answers_it_prints_80_columns_and_writes_the_report(no_network, monkeypatch):
    get, list_all, _ = _replay(sub="sub-block-degraded")

    class Recorded:
        def __init__(self, creds):
            self.get, self.list_all = get, list_all

    monkeypatch.setattr(preflight_read, "credentials", lambda: object())
    monkeypatch.setattr(preflight_read, "Reader", Recorded)
    out = no_network / "out" / "prod"
    result = runner.invoke(app, ["preflight", "prod", "--out", str(out)])
    assert result.exit_code == 1, result.output  # the degraded sub-block
    shown = [line for line in result.output.splitlines() if not line.startswith("wrote ")]
    assert max(len(line) for line in shown) <= 80, result.output  # the path is the user's
    data = json.loads((out / "preflight.json").read_text())
    assert data["verdict"] == FAIL and data["stack"] == "prod"
    assert any(f["check"] == "sub-block" and f["status"] == FAIL for f in data["findings"])
    assert "No Google API promises" in result.output
    again = runner.invoke(app, ["preflight", "prod", "--out", str(out)])
    assert again.exit_code == 1 and "did not write" not in again.output  # its own file


def test_it_never_writes_over_a_file_it_did_not_write(tmp_path):
    from infra.tools.outdir import OutputError
    from infra.tools.report_preflight import write_report

    (tmp_path / "preflight.json").write_text('{"mine": true}')
    with pytest.raises(OutputError, match="did not write"):
        write_report(tmp_path, {"kind": "park-preflight"})
    link = tmp_path / "l"
    link.mkdir()
    (link / "preflight.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(OutputError, match="link"):
        write_report(link, {"kind": "park-preflight"})
    assert not (tmp_path / "elsewhere.json").exists()
