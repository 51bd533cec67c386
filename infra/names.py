"""Every name the stack gives or relies on: labels, ports, Kubernetes objects, cloud ids.

Constants are the same for every stack. Cloud names that live in a project (service accounts,
the registry repository, the bucket, the network) are derived per stack by :func:`stack_names`,
which the resolve step calls once; nothing else builds one of these strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ---- labels and annotations ---------------------------------------------------------------

PART_OF = {"app.kubernetes.io/part-of": "park-gke"}
APP_NAME_LABEL = "app.kubernetes.io/name"
# Node labels our node pools carry: which config pool, which slice of it, what it is for.
POOL_LABEL = "park-gke/pool"
SLICE_LABEL = "park-gke/slice"
ROLE_LABEL = "park-gke/role"
# Every Ray pod carries its workload's name: KubeRay names clusters with a random suffix, so
# metrics (PodMonitoring target labels) and the dashboard Service select on this label instead.
WORKLOAD_LABEL = "park-gke/workload"
# Set only when the stack's config flag asks for a public endpoint; the policy pack (policy/)
# rejects a LoadBalancer, NodePort or Ingress for Ray that lacks it.
EXPOSE_SERVE_ANNOTATION = "park-gke/expose-serve"
EXPOSE_DASHBOARD_ANNOTATION = "park-gke/expose-dashboard"
# Labels KubeRay puts on every head and worker pod (ray-operator/controllers/ray/utils/
# constant.go); the Ray NetworkPolicy and the PodMonitorings select on them.
RAY_NODE_LABEL = "ray.io/is-ray-node"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"
RAY_CLUSTER_LABEL = "ray.io/cluster"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
GKE_NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Taints beside the TPU one (which is a catalog fact).
QUEUED_TAINT_KEY = "cloud.google.com/gke-queued"
GPU_TAINT_KEY = "nvidia.com/gpu"

# ---- Kubernetes objects -------------------------------------------------------------------

WORKLOAD_KSA = "park-workload"  # the KSA every Ray pod runs as (Workload Identity)
HF_SECRET_NAME = "hf-token"
HF_SECRET_KEY = "token"
NETWORK_POLICY_NAME = "ray-pods"
TRAINING_JOB_NAME = "park-train"
SERVICE_NAME = "park-serve"
OPENAI_SERVICE_NAME = "park-openai"
DASHBOARD_NAME = "ray-dashboard"
GRAFANA_CONFIGMAP = "park-grafana-dashboards"
GCS_VOLUME = "gcs"
HF_TOKEN_VOLUME = "hf-token"
# The HF token reaches pods as a read-only file (huggingface_hub reads HF_TOKEN_PATH), never as
# an environment variable, which leaks into `ray job` logs, crash dumps and /proc/<pid>/environ.
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
# Namespaces other components run in.
GMP_NAMESPACE = "gmp-system"  # Google Managed Prometheus collectors scrape from here
KUBERAY_NAMESPACE = "kuberay-system"  # the Helm-installed operator and TPU webhook
CERT_MANAGER_NAMESPACE = "cert-manager"
KUEUE_NAMESPACE = "kueue-system"

# ---- ports --------------------------------------------------------------------------------

SERVE_PORT = 8000
DASHBOARD_PORT = 8265
METRICS_PORT = 8080
METRICS_PORT_NAME = "metrics"
HEAD_PORTS = {"gcs-server": 6379, "dashboard": DASHBOARD_PORT, "client": 10001, "serve": SERVE_PORT}
# The GKE TPU device plugin serves chip metrics on the node; Ray's agent reads them from
# TPU_DEVICE_PLUGIN_ADDR and exports them as ray_tpu_* (the KubeRay TPU webhook sets the same).
TPU_DEVICE_PLUGIN_METRICS_PORT = 2112

# The user and group of Ray's images (`ray`, `users`). A uid without a passwd entry breaks
# getpass.getuser() in Ray and torch, so we keep the image's own non-root user.
RAY_UID = 1000
RAY_GID = 100

# ---- cloud names of one stack -------------------------------------------------------------


@dataclass(frozen=True)
class StackNames:
    """The project-scoped names of one stack, derived once (infra.resolve)."""

    cluster: str
    node_service_account_id: str
    workload_service_account_id: str
    workload_service_account_email: str
    registry_repository: str
    registry_url: str
    bucket: str
    network: str
    subnetwork: str
    router: str
    nat: str
    stack_id: str  # the stack's name as a metric id: lowercase letters, digits, "_"
    log_metric_prefix: str  # Cloud Logging metric names of the training run
    dashboard: str  # the IAP dashboard's static address and certificate
    namespace: str
    workload_ksa: str = WORKLOAD_KSA

    @property
    def workload_identity_member(self) -> str:
        """The Workload Identity principal of the Ray pods (project pool, namespace, KSA)."""
        project = self.workload_service_account_email.split("@", 1)[1].split(".", 1)[0]
        return f"serviceAccount:{project}.svc.id.goog[{self.namespace}/{self.workload_ksa}]"


def _metric_id(text: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())


def stack_names(
    *,
    project: str,
    region: str,
    stack: str,
    cluster: str,
    namespace: str,
    bucket: str | None,
    registry_repository: str,
) -> StackNames:
    """Names for one stack's project-scoped resources."""
    workload_sa = "park-workload"
    repository = registry_repository
    return StackNames(
        cluster=cluster,
        node_service_account_id=f"{cluster}-nodes"[:30],
        workload_service_account_id=workload_sa,
        workload_service_account_email=f"{workload_sa}@{project}.iam.gserviceaccount.com",
        registry_repository=repository,
        registry_url=f"{region}-docker.pkg.dev/{project}/{repository}",
        bucket=bucket or f"{project}-{stack}-park",
        network=f"{cluster}-vpc",
        subnetwork=f"{cluster}-nodes",
        router=f"{cluster}-router",
        nat=f"{cluster}-nat",
        stack_id=_metric_id(stack),
        log_metric_prefix=f"park_{_metric_id(stack)}_train",
        dashboard=f"{cluster}-{DASHBOARD_NAME}",
        namespace=namespace,
    )


# ---- Kueue objects of a queued pool --------------------------------------------------------


def local_queue_name(pool: str) -> str:
    """The LocalQueue jobs on a queued pool name in their `kueue.x-k8s.io/queue-name` label."""
    return pool


def cluster_queue_name(pool: str) -> str:
    return f"park-{pool}"


def flavor_name(pool: str) -> str:
    return f"park-{pool}"
