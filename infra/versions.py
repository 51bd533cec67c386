"""What the stack pins: one place for every version a manifest, chart or rule relies on."""

from __future__ import annotations

RAY_VERSION = "2.60.0"  # the Ray of the images, the RayJob / RayService and the local runs
KUBERAY_VERSION = "1.7.0"  # kuberay-operator chart (install: helm) and the vendored CRDs
KUEUE_VERSION = "0.19.2"  # chart oci://registry.k8s.io/kueue/charts/kueue (no leading "v")
CERT_MANAGER_VERSION = "v1.18.2"  # for the KubeRay TPU webhook (install: helm, multi-host)
IMAGE_TAG = "0.1.0"  # the workload images' tag: the package version
# The serving engines' versions are in their records (infra/engines.py).

# Multi-slice PyTorch training: Ray 2.59.0 raised, 2.60.0 sets MEGASCALE_* (FACTS.md).
RAY_MULTISLICE_TORCH_MIN = (2, 60, 0)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.60.0"`` → ``(2, 60, 0)``."""
    return tuple(int(part) for part in version.split("."))
