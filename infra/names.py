"""Every name the stack gives or relies on: labels, ports, Kubernetes objects, cloud ids.

Constants are the same for every stack. Cloud names that live in a project (service accounts,
the registry repository, the bucket, the network) are derived per stack by :func:`stack_names`,
which the resolve step calls once; nothing else builds one of these strings.
"""

from __future__ import annotations

import hashlib
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
# A laddered pool's rung: its nodes' label and taint (value: the rung's tag, rsv / spot / ...),
# so only a job Kueue admitted on that rung (its flavor's nodeSelector) lands there.
RUNG_LABEL = "park-gke/capacity"
GPU_TAINT_KEY = "nvidia.com/gpu"

# ---- Kubernetes objects -------------------------------------------------------------------

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
# Service accounts, the registry repository, networks, routers, log metrics and the dashboard's
# address live in the project, not in a cluster: two stacks in one project must not share any
# of them. Workload Identity makes the same namespace/KSA in any cluster of a project the same
# principal ("identity sameness"), so the KSA is per stack too. Everything derives from the
# stack's prefix, `park-<stack>`; a repository is shared only when a stack says so.

SERVICE_ACCOUNT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")  # 6-30 chars (IAM)
RFC1035_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")  # networks, routers (Compute)


def service_account_member(email: str) -> str:
    """A service account (or a Workload Identity principal) as IAM bindings name a member: the
    components bind it, the local bucket's gate (infra/tools/local/bucket.py) matches it."""
    return f"serviceAccount:{email}"


@dataclass(frozen=True)
class StackNames:
    """The project-scoped names of one stack, derived once (infra.resolve)."""

    prefix: str  # park-<stack>, DNS-safe
    project: str
    cluster: str
    node_service_account_id: str
    workload_service_account_id: str
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
    workload_ksa: str

    @property
    def workload_service_account_email(self) -> str:
        return f"{self.workload_service_account_id}@{self.project}.iam.gserviceaccount.com"

    @property
    def workload_pool(self) -> str:
        """The project's Workload Identity pool (it exists once a WI cluster does)."""
        return f"{self.project}.svc.id.goog"

    @property
    def workload_identity_member(self) -> str:
        """The Ray pods' Workload Identity principal: project pool, namespace, KSA."""
        return service_account_member(f"{self.workload_pool}[{self.namespace}/{self.workload_ksa}]")


def _metric_id(text: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())


def dns_label(text: str) -> str:
    """``My_Stack.1`` → ``my-stack-1``: lowercase letters, digits and single dashes."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return label or "stack"


def service_account_id(prefix: str, role: str) -> str:
    """``<prefix>-<role>`` as a valid IAM account id (6-30 chars, ends in a letter or digit);
    a prefix too long to fit is shortened and made unique with a hash of the whole of it."""
    candidate = f"{prefix}-{role}"
    if len(candidate) <= 30 and SERVICE_ACCOUNT_ID.match(candidate):
        return candidate
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:6]
    keep = 30 - len(role) - len(digest) - 2
    head = prefix[:keep].rstrip("-") or "park"
    return f"{head}-{digest}-{role}"


def stack_names(
    *,
    project: str,
    region: str,
    stack: str,
    cluster: str | None,
    namespace: str,
    bucket: str | None,
    registry_repository: str | None,
) -> StackNames:
    """Names for one stack's project-scoped resources."""
    prefix = f"park-{dns_label(stack)}"
    repository = registry_repository or prefix
    return StackNames(
        prefix=prefix,
        project=project,
        cluster=cluster or prefix,
        node_service_account_id=service_account_id(prefix, "nodes"),
        workload_service_account_id=service_account_id(prefix, "workload"),
        registry_repository=repository,
        registry_url=f"{region}-docker.pkg.dev/{project}/{repository}",
        bucket=bucket or f"{project}-{stack}-park",
        network=f"{prefix}-vpc",
        subnetwork=f"{prefix}-nodes",
        router=f"{prefix}-router",
        nat=f"{prefix}-nat",
        stack_id=_metric_id(stack),
        log_metric_prefix=f"park_{_metric_id(stack)}_train",
        dashboard=f"{prefix}-{DASHBOARD_NAME}",
        namespace=namespace,
        workload_ksa=f"{prefix}-workload",
    )


def run_name(stack: str, job: str, run_id: str | None) -> str:
    """A run's folder in the bucket (checkpoints, exports): per stack, job and run id."""
    return f"{stack}-{job}" + (f"-{run_id}" if run_id else "")


def job_object_name(component: str, run_id: str | None) -> str:
    """A RayJob's name: its component's, with the run id a new run of it is named by (the
    object changes, so `pulumi up` replaces the finished one and KubeRay runs the new one)."""
    return f"{component}-{run_id}" if run_id else component


# ---- Kueue objects of a queued pool --------------------------------------------------------


def local_queue_name(pool: str) -> str:
    """The LocalQueue jobs on a queued pool name in their `kueue.x-k8s.io/queue-name` label."""
    return pool


def cluster_queue_name(pool: str) -> str:
    return f"park-{pool}"


def flavor_name(pool: str, rung: str | None = None) -> str:
    """A queued pool's flavor, or one rung's of a laddered pool (`rung`: its tag)."""
    return f"park-{pool}" if rung is None else f"park-{pool}-{rung}"
