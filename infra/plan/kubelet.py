"""Strings that reach a container, written so that the kubelet hands over exactly them.

The kubelet expands `$(NAME)` in a container's `command`, `args` and `env[].value` when NAME is
a variable of that container (Kubernetes: "Define dependent environment variables"; the rule
is k8s.io/kubernetes third_party/forked/golang/expansion): `$$` becomes `$`, an undefined
`$(NAME)` is left as written. KubeRay copies a RayJob's `entrypoint` into its submitter's
`args` (`ray job submit ... -- <entrypoint>`), beside variables of its own
(`RAY_DASHBOARD_ADDRESS`, `RAY_JOB_SUBMISSION_ID`). So a stack value holding `$(HOME)` would
change meaning on its way in. Every value park places in those fields goes through `literal`:
each `$` doubled, which the kubelet turns back into the value as written, whatever follows it.
A reference park means (`$(TPU_DEVICE_PLUGIN_HOST_IP)` in infra/plan/ray/pods.py) is written
as such, never through here.
"""

from __future__ import annotations


def literal(value: str) -> str:
    """`value` as a command word, argument or env value the kubelet leaves as `value`."""
    return value.replace("$", "$$")


def as_run(value: str) -> str:
    """What the kubelet makes of a `literal` value (park local runs what a pod would)."""
    return value.replace("$$", "$")
