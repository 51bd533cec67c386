"""Generated README sections, so the docs cannot drift from the code.

`python -m infra.tools.docs` rewrites the marked blocks of README.md; a test fails when they
are stale.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.spec.models import StackConfig

README = Path(__file__).resolve().parents[2] / "README.md"

# One line per key: what it is for. A test fails when a config field has no line here.
DESCRIPTIONS: dict[str, str] = {
    "gcp:project": "GCP project id (placeholder in the shipped stacks: `pulumi config set`).",
    "gcp:region": "Region of the network, registry and bucket.",
    "park:zone": "Zone of the cluster and every pool; must offer TPU v6e.",
    "park:extraTpuZones": "Zones to accept beyond the catalog's known v6e zones.",
    "park:namespace": "Kubernetes namespace of the Ray workloads.",
    "park:hfToken": "Secret: `pulumi config set --secret park:hfToken` (or ESC); gated models.",
    "park:network": "New VPC (default) or an existing network.",
    "park:network.existingNetwork": "Use this network instead of creating a VPC.",
    "park:network.existingSubnetwork": "Its subnet, carrying the pods/services ranges.",
    "park:network.subnetCidr": "Node range of the new subnet.",
    "park:network.podsCidr": "Secondary range for pods.",
    "park:network.servicesCidr": "Secondary range for services.",
    "park:network.masterCidr": "/28 of the private control plane.",
    "park:network.podsRangeName": "Name of the pods secondary range.",
    "park:network.servicesRangeName": "Name of the services secondary range.",
    "park:cluster": "The GKE Standard cluster.",
    "park:cluster.name": "GKE cluster name (default `park-<stack>`).",
    "park:cluster.releaseChannel": "RAPID, REGULAR, STABLE or EXTENDED; upgrades the cluster.",
    "park:cluster.version": "Unset: the channel's default. A pin (`1.35`) is the initial version.",
    "park:cluster.dnsEndpoint": "DNS-based control-plane endpoint (IAM); the kubeconfig uses it.",
    "park:cluster.privateNodes": "Nodes without public IPs (egress through Cloud NAT).",
    "park:cluster.privateEndpoint": "Control plane reachable only from the VPC.",
    "park:cluster.masterAuthorizedNetworks": "`[{cidr, name}]` allowed to reach the control plane.",
    "park:cluster.deletionProtection": "Refuse `pulumi destroy` of the cluster.",
    "park:cpuPool": "The CPU pool for Ray heads and system pods.",
    "park:cpuPool.machineType": "Machine type.",
    "park:cpuPool.minNodes": "Autoscaling minimum.",
    "park:cpuPool.maxNodes": "Autoscaling maximum.",
    "park:cpuPool.diskSizeGb": "Boot disk, GB; unset: what its pods need (`park validate`).",
    "park:kuberay": "How KubeRay gets onto the cluster.",
    "park:kuberay.install": "`addon` (GKE Ray Operator add-on, with the TPU webhook) or `helm`.",
    "park:kuberay.version": "kuberay-operator chart version (helm).",
    "park:kuberay.logging": "Ray add-on: Ray logs to Cloud Logging.",
    "park:kuberay.monitoring": "Ray add-on: Ray metrics to Managed Prometheus.",
    "park:kuberay.tpuWebhookChart": "helm, multi-host: path of the kuberay-tpu-webhook chart.",
    "park:kueue": "Kueue, installed only when a TPU pool is `queued`.",
    "park:kueue.version": "Kueue Helm chart version (OCI, registry.k8s.io).",
    "park:tpuPools": "TPU pools: one GKE node pool per slice.",
    "park:tpuPools[].name": "Pool name (node pools are `<name>-s<i>`).",
    "park:tpuPools[].machineType": "ct6e-standard-1t, -4t or -8t.",
    "park:tpuPools[].topology": "Slice topology the machine type offers (e.g. 2x4, 4x4).",
    "park:tpuPools[].slices": "Number of slices (node pools).",
    "park:tpuPools[].capacity": "on-demand, spot, reservation, flex-start or queued.",
    "park:tpuPools[].reservation": "Reservation name (capacity `reservation` only).",
    "park:tpuPools[].autoscaling": "Scale each slice between 0 and its hosts.",
    "park:tpuPools[].maxRunDuration": "flex-start: longest a node lives, e.g. `86400s`.",
    "park:tpuPools[].diskSizeGb": "Boot disk, GB; unset: what its pods need (`park validate`).",
    "park:gpuPools": "Optional GPU pools beside the TPU pools.",
    "park:gpuPools[].name": "Pool name.",
    "park:gpuPools[].machineType": "e.g. a3-highgpu-8g.",
    "park:gpuPools[].acceleratorType": "e.g. nvidia-h100-80gb.",
    "park:gpuPools[].acceleratorCount": "GPUs per node.",
    "park:gpuPools[].nodes": "Maximum nodes (0 while idle).",
    "park:gpuPools[].capacity": "on-demand, spot, reservation or flex-start.",
    "park:gpuPools[].reservation": "Reservation name (capacity `reservation` only).",
    "park:gpuPools[].autoscaling": "Scale between 0 and `nodes`.",
    "park:gpuPools[].diskSizeGb": "Boot disk size.",
    "park:storage": "The bucket for checkpoints and models.",
    "park:storage.bucket": "Bucket name (default `<project>-<stack>-park`).",
    "park:storage.location": "Bucket location (default: the region).",
    "park:storage.versioning": "Object versioning.",
    "park:storage.forceDestroy": "Let `pulumi destroy` delete a non-empty bucket.",
    "park:storage.mountPath": "Where Ray pods see the bucket (GCS FUSE).",
    "park:registry": "The Artifact Registry repository for workload images.",
    "park:registry.repository": "Repository id (default `park-<stack>`).",
    "park:registry.create": "`false`: use an existing repository, e.g. one stacks share.",
    "park:training": "The training RayJob.",
    "park:training.enabled": "Create the RayJob.",
    "park:training.pool": "TPU pool it runs on.",
    "park:training.image": "Image (default: park-workloads in the stack's registry).",
    "park:training.strategy": "`ddp` or `fsdp2`.",
    "park:training.model": "HF causal LM: hub id, `gs://`, a bucket-mount path, `park:tiny-llama`.",
    "park:training.tokenizer": "Tokenizer source like `model` (default: the model's).",
    "park:training.init": "`pretrained` weights or `config` (from scratch); `auto`: by source.",
    "park:training.modelSize": "GPT preset when no `model`: tiny, small, gpt2-small/-medium, 1b.",
    "park:training.steps": "Optimizer steps in total (a resumed run continues to it).",
    "park:training.globalBatchSize": "Sequences per step, a multiple of the workers (chips).",
    "park:training.microBatchSize": "Sequences per chip per pass; unset: the most that fit.",
    "park:training.seqLen": "Tokens per sequence (at most the model's context).",
    "park:training.learningRate": "Peak learning rate (AdamW).",
    "park:training.warmupSteps": "Linear warmup steps, then `lrSchedule`.",
    "park:training.lrSchedule": "`cosine`, `linear` (to `minLrRatio`) or `constant`.",
    "park:training.minLrRatio": "Final learning rate as a fraction of the peak.",
    "park:training.data": "`synthetic`, tokens, jsonl/json/parquet/txt, `hf:NAME`, `park:facts`.",
    "park:training.objective": "`clm` (packed text) or `sft` (chat template, loss on responses).",
    "park:training.dataSplit": "Split of an `hf:` data set.",
    "park:training.textField": "Record field with the text (`clm`).",
    "park:training.messagesField": "Record field with a chat, `[{role, content}]` (`sft`).",
    "park:training.promptField": "Prompt field(s) of records without a chat (`sft`).",
    "park:training.responseField": "Response field of records without a chat (`sft`).",
    "park:training.checkpointEvery": "Steps between checkpoints (sharded DCP, for resume).",
    "park:training.keepCheckpoints": "Checkpoints kept in the bucket.",
    "park:training.export": "An HF folder at `.../<run>/export/final` when the run ends.",
    "park:training.exportEvery": "Also export at every Nth checkpoint (0: only at the end).",
    "park:training.exportDtype": "`auto` (bf16 when trained in bf16), `float32`, `bfloat16`.",
    "park:training.exportMaxShardSize": "Largest safetensors file, e.g. `5GB`; more get an index.",
    "park:training.activationCheckpointing": "Recompute activations in backward (`model` only).",
    "park:training.numSlices": "Slices to train across (≤ the pool's slices).",
    "park:training.maxFailures": "Restarts from the last checkpoint after a lost worker.",
    "park:training.ttlSecondsAfterFinished": "Keep the finished cluster this long, then free TPUs.",
    "park:training.activeDeadlineSeconds": "Kill the job after this long.",
    "park:training.backoffLimit": "Retries (each a new Ray cluster).",
    "park:training.estimatedStepSeconds": "Step time used by `park cost` for the run estimate.",
    "park:serving": "The serving RayService.",
    "park:serving.enabled": "Create the RayService.",
    "park:serving.pool": "TPU pool it runs on (not training's).",
    "park:serving.image": "Image (default by engine).",
    "park:serving.engine": "`vllm-torchtpu` (default) or `vllm-tpu` (JAX; separate image).",
    "park:serving.models": "Served models.",
    "park:serving.models[].name": "OpenAI model id clients ask for.",
    "park:serving.models[].source": "HF id, `gs://` (own bucket: mounted), `training` or `rl`.",
    "park:serving.models[].baseModel": "What a fine-tuned source was trained from (its facts).",
    "park:serving.models[].tensorParallelSize": "Default: every chip of one slice.",
    "park:serving.models[].maxModelLen": "Context length.",
    "park:serving.models[].enableExpertParallel": "For MoE models.",
    "park:serving.models[].minReplicas": "Serve autoscaling minimum.",
    "park:serving.models[].maxReplicas": "Serve autoscaling maximum.",
    "park:serving.models[].engineKwargs": "Other vLLM engine arguments.",
    "park:serving.upgradeStrategy": "`None` (in place), `NewCluster` (blue/green: 2x TPUs), ...",
    "park:serving.exposePublicly": "LoadBalancer for the OpenAI endpoint (default ClusterIP).",
    "park:rl": "A GRPO RayJob: learner and vLLM rollout engines on their own pools.",
    "park:rl.enabled": "Create the RL RayJob.",
    "park:rl.learnerPool": "TPU pool of the learner (one Ray Train worker per chip, one slice).",
    "park:rl.rolloutPool": "TPU or GPU pool of the rollout engines (not the learner's).",
    "park:rl.image": "Image (default: park-workloads in the stack's registry).",
    "park:rl.model": "The policy: HF hub id, `gs://`, or a bucket-mount path.",
    "park:rl.init": "`pretrained` weights or `config` (random).",
    "park:rl.data": "Prompts with answers: jsonl/json/parquet or `hf:NAME[:CONFIG]`.",
    "park:rl.dataSplit": "Split of an `hf:` data set.",
    "park:rl.promptField": "Record field of the prompt.",
    "park:rl.answerField": "Record field of the reference answer.",
    "park:rl.groupSize": "Completions sampled per prompt (≥ 2: advantages are within a group).",
    "park:rl.promptsPerStep": "Prompts per learner step (x groupSize: a multiple of the chips).",
    "park:rl.samplingTemperature": "Sampling temperature of the rollouts.",
    "park:rl.maxPromptTokens": "Longest prompt; with maxResponseTokens the engines' context.",
    "park:rl.maxResponseTokens": "Tokens sampled per completion at most.",
    "park:rl.rewards": "`exact_match`, `numeric`, `format`, or `module:function`; summed.",
    "park:rl.rewardWeights": "One weight per reward (default 1 each).",
    "park:rl.klCoef": "Weight of the KL to the frozen reference policy (0: none).",
    "park:rl.maxStaleness": "Policy versions a rollout may lag the learner.",
    "park:rl.syncEvery": "Publish the policy to the engines every N learner steps.",
    "park:rl.steps": "Learner steps in total.",
    "park:rl.learningRate": "Learning rate (AdamW).",
    "park:rl.strategy": "Learner: `ddp` or `fsdp2`.",
    "park:rl.microBatchSize": "Completions per chip per pass; unset: the most that fit.",
    "park:rl.activationCheckpointing": "Learner: recompute activations in backward.",
    "park:rl.tensorParallelSize": "Chips per rollout engine; unset: the smallest that fits.",
    "park:rl.gpuMemoryUtilization": "Share of each chip's memory a vLLM engine keeps.",
    "park:rl.checkpointEvery": "Learner steps between checkpoints.",
    "park:rl.export": "The final policy as an HF folder at `.../<run>/export/final`.",
    "park:rl.maxFailures": "Restarts from the last checkpoint after a lost learner worker.",
    "park:rl.ttlSecondsAfterFinished": "Keep the finished cluster this long, then free the TPUs.",
    "park:rl.activeDeadlineSeconds": "Kill the job after this long.",
    "park:rl.backoffLimit": "Retries (each a new Ray cluster).",
    "park:rl.estimatedStepSeconds": "Step time (rollout + learner + sync) for `park cost`.",
    "park:prices": "Override list prices for `park cost` (the output names the source).",
    "park:prices.source": "Where your prices come from, shown by `park cost`.",
    "park:prices.tpuChipHour": "$/chip-hour by capacity type, e.g. `{on-demand: 2.5, spot: 0.95}`.",
    "park:prices.machineHour": "$/hour by machine type of the CPU and GPU pools.",
    "park:prices.clusterHour": "GKE cluster management fee, $/hour.",
    "park:observability": "Metrics and dashboards.",
    "park:observability.podMonitoring": "PodMonitoring for Ray head and workers.",
    "park:observability.tpuMetrics": "TPU chip metrics (`ray_tpu_*`, from the TPU device plugin).",
    "park:observability.exposeDashboard": "Opt-in: the RayService's Ray dashboard behind IAP.",
    "park:observability.iapMembers": "Who IAP lets in, e.g. `group:ml@example.com`.",
    "park:observability.dashboardDomain": "Host name of the IAP-protected dashboard (certificate).",
    "park:observability.iapOauthClientId": "OAuth client id IAP signs users in with.",
    "park:observability.iapOauthSecret": "Secret (key `key`) holding that client's secret.",
    "park:observability.grafana": 'A Grafana dashboard ConfigMap (`grafana_dashboard: "1"`).',
    "park:observability.trainingMetrics": "Loss and tokens/s as log-based metrics.",
    "park:observability.scrapeInterval": "Managed Prometheus scrape interval of Ray pods.",
    "park:policy": "Policy pack settings for this stack.",
    "park:policy.enforcement": "Rule name → mandatory, advisory or disabled.",
    "park:policy.prodLike": "Treat as production (default: stack name starts with `prod`).",
    "park:policy.acknowledgePublic": (
        "What a production stack exposes on purpose (control-plane, nodes, serving); "
        "otherwise refused there, warned elsewhere."
    ),
}


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return f"list of {_type_name(inner)}"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if isinstance(value, BaseModel):
        return ""
    if value in (None, [], {}):
        return "—"
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def config_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every config key, nested ones included."""
    rows = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if model is StackConfig and name == "stack":
                continue
            if model is StackConfig:
                key = {"project": "gcp:project", "region": "gcp:region"}.get(
                    name, f"park:{field.alias or name}"
                )
            else:
                key = f"{prefix}.{field.alias or name}"
            rows.append(
                (key, _type_name(field.annotation), _default(field), DESCRIPTIONS.get(key, ""))
            )
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, key)
            elif typing.get_origin(annotation) is list:
                (inner,) = typing.get_args(annotation)
                if (
                    isinstance(inner, type)
                    and issubclass(inner, BaseModel)
                    and inner.__name__ != "AuthorizedNetwork"
                ):
                    walk(inner, f"{key}[]")

    walk(StackConfig, "")
    return rows


def config_reference() -> str:
    lines = ["| key | type | default | what it is for |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {desc} |" for k, t, d, desc in config_rows()]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"README has no {name} block")
    return pattern.sub(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)


def stacks_summary(render: Callable[[str], Any] | None = None) -> str:
    """What each shipped stack declares, from its offline render."""
    from collections import Counter

    from infra.spec.read import stack_name_of
    from infra.tools.render import render_stack_file

    out = []
    for path in sorted((README.parent / "stacks").glob("Pulumi.*.yaml")):
        rendered = render(stack_name_of(path)) if render else render_stack_file(path)
        plan, config = rendered.plan, rendered.config
        by_type = Counter(r.type for r in rendered.resources if r.custom)
        workloads = [
            f"{m['kind']} `{m['metadata']['name']}`"
            for m in rendered.manifests()
            if m["apiVersion"].startswith("ray.io")
        ]
        out.append(
            f"**{config.stack}** (`{path.relative_to(README.parent)}`): "
            f"{len(rendered.resources)} resources ({sum(by_type.values())} cloud/Kubernetes, "
            f"the rest components); KubeRay via {config.kuberay.install}; "
            f"{', '.join(workloads) or 'no Ray workloads'}.\n"
        )
        out.append("| TPU pool | machine type | topology | slices | hosts | chips | capacity |")
        out.append("|---|---|---|---|---|---|---|")
        for pool in plan.tpu_pools:
            out.append(
                f"| {pool.name} | {pool.slice.machine_type} | {pool.slice.topology} | "
                f"{pool.slices} | {pool.total_hosts} | {pool.total_chips} | {pool.capacity} |"
            )
        out.append("")
        out.append(
            "Resources: " + ", ".join(f"{n} x `{t}`" for t, n in sorted(by_type.items())) + "\n"
        )
    return "\n".join(out).rstrip()


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def cost_table() -> str:
    """`park cost` of every shipped stack, at the shipped list prices."""
    from infra.stack import from_file
    from infra.tools.cost import estimate

    lines = [
        "| stack | TPU pools (chips / hosts) | everything up | idle | serving floor "
        "| one training run |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted((README.parent / "stacks").glob("Pulumi.*.yaml")):
        cost = estimate(from_file(path))
        tpu = [p for p in cost.pools if p.kind == "tpu"]
        pools = "; ".join(
            f"{p.name}: {p.slices} x {p.topology} {p.capacity} ({p.chips} / {p.hosts})" for p in tpu
        )
        run = cost.training_run
        run_text = "—" if run is None else f"{_money(run.cost)} ({run.steps:,} steps)"
        if cost.rl_run is not None:
            learner, rollout = cost.rl_run
            costs = (learner.cost, rollout.cost)
            both = None if costs[0] is None or costs[1] is None else costs[0] + costs[1]
            rl_text = f"RL {_money(both)} ({learner.steps:,} steps, both pools)"
            run_text = rl_text if run is None else f"{run_text}; {rl_text}"
        lines.append(
            f"| {cost.stack} | {pools} | {_money(cost.full_per_hour)}/h | "
            f"{_money(cost.idle_per_hour)}/h | {_money(cost.serving_floor_per_hour)}/h | "
            f"{run_text} |"
        )
    return "\n".join(lines)


def training_fit_table() -> str:
    """Each shipped stack's training step, per chip at its peak (infra.training_fit, at the
    micro-batch the plan picks): what `park validate` prints, one row a stack."""
    from infra.stack import from_file

    gib = 1024**3
    lines = [
        "| stack | model | strategy on chips | micro-batch x steps | states | activations "
        "| logits | reserve | total of usable (GiB) | peak at |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted((README.parent / "stacks").glob("Pulumi.*.yaml")):
        plan = from_file(path)
        training = plan.training
        if training is None:
            continue
        spec, fit = training.spec, training.fit
        model = f"`{spec.model}`" if spec.model else f"GPT preset `{spec.model_size}`"
        head = (
            f"| {plan.stack} | {model} | {spec.strategy} on {training.workers} | "
            f"{training.micro_batch} x {training.accumulation_steps} |"
        )
        if fit is None:
            lines.append(f"{head} not estimated: {training.facts.reason} ||||||")
            continue
        cells = (fit.states_bytes, fit.activations_bytes, fit.logits_bytes, fit.reserve_bytes)
        lines.append(
            f"{head} {' | '.join(f'{v / gib:.1f}' for v in cells)} | "
            f"{fit.total_bytes / gib:.1f} of {fit.usable_bytes / gib:.2f} | {fit.phase} |"
        )
    return "\n".join(lines)


def generated_blocks(render: Callable[[str], Any] | None = None) -> dict[str, str]:
    return {
        "training-fit": training_fit_table(),
        "config-reference": config_reference(),
        "stacks-summary": stacks_summary(render),
        "cost": cost_table(),
    }


def render_readme(text: str, render: Callable[[str], Any] | None = None) -> str:
    """README with its generated blocks rewritten (`render`: a cached stack renderer)."""
    for name, body in generated_blocks(render).items():
        text = replace_block(text, name, body)
    return text


def main() -> int:
    README.write_text(render_readme(README.read_text()))
    print(f"updated {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
