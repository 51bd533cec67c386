"""A TPU v6e slice, KubeRay and an OpenAI-compatible endpoint on a GKE cluster you already run.

The cluster (and its network) stay yours: park-gke looks the cluster up, checks at preview time
that it has what Ray on TPU needs (Standard mode, Workload Identity, GCS FUSE, the Ray add-on,
a new enough version), then adds one v6e-8 node pool, a bucket and a registry with a workload
identity, the workload image (built from this checkout and pushed), the Ray namespace, the
model staged into the bucket (an awaited Job), and a RayService serving Qwen3-1.7B across the
slice's 8 chips, created only once all of that exists.

    pulumi config set gcp:project MY_PROJECT
    pulumi config set clusterName team-gke
    pulumi preview
"""

import pulumi

from park_gke import (
    ExistingCluster,
    KubeRayOperator,
    LlmService,
    ModelStaging,
    Storage,
    TpuSlicePool,
    WorkloadImage,
    Workspace,
    kubernetes_provider,
)

config = pulumi.Config()
project = pulumi.Config("gcp").require("project")
zone = config.get("zone") or "us-east5-b"

cluster = ExistingCluster(
    "cluster", {"project": project, "location": zone, "name": config.require("clusterName")}
)
# The cluster handle gives the pool its id (project, location) and the nodes' service account.
slice_pool = TpuSlicePool(
    "serve-pool",
    {
        "cluster": cluster,
        "name": "serve-v6e-8",
        "machine_type": "ct6e-standard-8t",
        "topology": "2x4",
    },
)
storage = Storage(  # names derive from the Pulumi stack: bucket <project>-<stack>-park, ...
    "storage",
    {
        "project": project,
        "region": zone.rsplit("-", 1)[0],
        "node_service_account": cluster.node_service_account,
        "cluster": cluster,
    },
)

# The image the pods run, built from this checkout and pushed to the stack's registry.
image = WorkloadImage(
    "image",
    {"repository": storage.registry_url.apply(lambda url: f"{url}/park-workloads")},
    pulumi.ResourceOptions(depends_on=[storage]),
)

k8s = kubernetes_provider("team-gke", cluster.kubeconfig, depends_on=[])
in_cluster = pulumi.ResourceOptions(providers={"kubernetes": k8s})
KubeRayOperator("kuberay", {"install": "addon"}, in_cluster)  # the add-on: nothing to install
workspace = Workspace("workspace", {"project": project}, in_cluster)
# The hub model, copied once into the bucket the replica reads it from; awaited by `up`.
staged = ModelStaging(
    "models",
    {
        "project": project,
        "models": ["Qwen/Qwen3-1.7B"],
        "image": image.ref,
        "namespace": workspace,
        "bucket": storage,
    },
    in_cluster.merge(pulumi.ResourceOptions(depends_on=[*workspace.ready, storage])),
)
# The Ray head has no node selector here: it runs on the cluster's own (untainted) nodes.
service = LlmService(
    "llm",
    {
        "project": project,
        "location": zone,
        "pool": slice_pool,
        "namespace": workspace,
        "bucket": storage,
        "image": image.ref,
        "models": [{"name": "qwen3-1.7b", "source": "Qwen/Qwen3-1.7B"}],
    },
    in_cluster.merge(
        pulumi.ResourceOptions(depends_on=[*workspace.ready, *slice_pool.node_pools, staged])
    ),
)

pulumi.export("endpoint_service", service.endpoint_service)
pulumi.export("bucket", storage.bucket)
pulumi.export("node_pools", slice_pool.node_pool_names)
