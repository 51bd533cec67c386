"""Readers of rendered manifests, for the checks: which pod templates a Ray custom resource
holds (`pods`) and what a TPU worker group must be (`tpu_groups`). `park validate`
(infra/tools/checks.py, netpol.py) and the policy pack (policy/) ask them, so each question is
answered once, on what was rendered rather than on the plan."""
