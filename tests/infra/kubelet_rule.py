"""What the kubelet runs of a container spec, and what KubeRay's submitter runs of a RayJob:
written here from their documented behaviour and sources, not from park's code.

- Kubernetes' `$(VAR)` expansion (k8s.io/kubernetes third_party/forked/golang/expansion/
  expand.go; "Define dependent environment variables"): `$(NAME)` becomes NAME's value when
  NAME is a variable of the container, `$$` becomes `$`, anything else (an undefined name, a
  lone `$`, an unclosed `$(`) stays as written. Command and args expand with every variable of
  the container; each env value with the variables defined before it.
- KubeRay v1.7.0's submitter (ray-operator/controllers/ray/common/job.go BuildJobSubmitCommand,
  rayjob_controller.go configureSubmitterContainer): command `/bin/bash -ce --`, one argument
  holding `... ray job submit --address http://<dashboard> --runtime-env-json "<json>" ... --
  <entrypoint> ; ...`, and variables PYTHONUNBUFFERED, RAY_DASHBOARD_ADDRESS and
  RAY_JOB_SUBMISSION_ID appended to the container's own.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

# What KubeRay appends to the submitter container's env (rayjob_controller.go), with values
# as a running RayJob has them.
KUBERAY_SUBMITTER_ENV = {
    "PYTHONUNBUFFERED": "1",
    "RAY_DASHBOARD_ADDRESS": "park-train-raycluster-abcde-head-svc.park.svc.cluster.local:8265",
    "RAY_JOB_SUBMISSION_ID": "park-train-xyz12",
}


def expand(text: str, variables: dict[str, str]) -> str:
    """expand.go's Expand with MappingFuncFor(variables), rune for rune."""
    out: list[str] = []
    checkpoint, cursor = 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":  # escaped operator
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close >= 1:
                    read, is_var, advance = rest[1:close], True, close + 1
                else:  # incomplete reference
                    read, is_var, advance = "$(", False, 1
            else:  # an operator that does not begin an expression
                read, is_var, advance = "$" + rest[0], False, 1
            if is_var:
                out.append(variables.get(read, f"$({read})"))
            else:
                out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def container_env(container: dict[str, Any], appended: dict[str, str] | None = None) -> dict:
    """The container's variables as the kubelet resolves them, in order (each value expanded
    with those before it); `appended`: what the operator adds after them. valueFrom entries
    get a placeholder value."""
    resolved: dict[str, str] = {}
    entries = list(container.get("env") or [])
    entries += [{"name": k, "value": v} for k, v in (appended or {}).items()]
    for entry in entries:
        if "value" in entry:
            resolved[entry["name"]] = expand(str(entry["value"]), resolved)
        else:
            resolved[entry["name"]] = f"<{entry['name']} from valueFrom>"
    return resolved


def runs(container: dict[str, Any], appended: dict[str, str] | None = None) -> list[str]:
    """The argv the kubelet starts: command then args, each expanded."""
    env = container_env(container, appended)
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    return [expand(str(w), env) for w in words]


def submitter(rayjob: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """KubeRay's submitter container for a RayJob (its command and args filled in the way
    configureSubmitterContainer does) and the runtime env JSON it quotes into the args."""
    spec = rayjob["spec"]
    template = spec["submitterPodTemplate"]["spec"]["containers"][0]
    runtime_env = json.dumps(yaml.safe_load(spec.get("runtimeEnvYAML") or "{}"))
    address = "http://" + KUBERAY_SUBMITTER_ENV["RAY_DASHBOARD_ADDRESS"]
    job = KUBERAY_SUBMITTER_ENV["RAY_JOB_SUBMISSION_ID"]
    words = [
        "if", "!", "ray", "job", "status", "--address", address, job, ">/dev/null", "2>&1",
        ";", "then", "ray", "job", "submit", "--address", address, "--no-wait",
        "--runtime-env-json", json.dumps(runtime_env), "--submission-id", job,
        "--", spec["entrypoint"].strip(), ";", "fi", ";",
        "ray", "job", "logs", "--address", address, "--follow", job,
    ]  # fmt: skip
    container = {
        **template,
        "command": ["/bin/bash", "-ce", "--"],
        "args": [" ".join(words)],
    }
    return container, runtime_env


def submitted_entrypoint(rayjob: dict[str, Any]) -> list[str]:
    """The words `ray job submit` receives after `--`: the submitter's one argument as the
    kubelet expands it, then split as bash splits it (POSIX quoting: shlex)."""
    container, _ = submitter(rayjob)
    (line,) = runs(container, KUBERAY_SUBMITTER_ENV)[3:]
    words = shlex.split(line)
    start = words.index("--", words.index("submit")) + 1
    end = len(words) - words[::-1].index("fi") - 1  # `-- <entrypoint> ; fi ;`
    assert words[end - 1] == ";"
    return words[start : end - 1]
