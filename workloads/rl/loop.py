"""One GRPO run on one machine: the learner in this process (gloo, one rank), vLLM engines as
Ray actors, the weights exchanged through the sync contract after every update.

This is the local shape of the run (what ``park local rl`` is to drive); on a cluster the
learner becomes Ray Train workers on the learner slice and the engines sit on the rollout
slice, with the same store, pool, learner step and publish calls. Per step:

1. the pool catches every engine up to the newest published version, then samples
   ``group_size`` completions for each of ``prompts_per_step`` prompts;
2. the rollouts go through the store (staleness bound) and are scored by the rewards;
3. advantages within each group; the learner takes one GRPO step with the engines'
   log-probabilities as the behaviour policy's (so a stale rollout is importance-weighted);
4. the learner publishes the new version (every ``publish_every`` steps).

Each step prints one line: reward mean/spread, KL, clip fraction, response length, rollout
tokens/s, learner step time, sync time and staleness.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads.rl.grpo import LossSettings, group_advantages
from workloads.rl.prompts import Prompt, PromptOrder, chat_prompt, round_metrics, score
from workloads.rl.rewards import Rewards
from workloads.rl.rollout import RolloutEngine, RolloutPool, Sampling


@dataclass
class RLConfig:
    model: str = "park:tiny-llama"
    init: str = "config"  # the trainer's --init: pretrained weights or random from the config
    rewards: list[str] = field(default_factory=lambda: ["numeric"])
    reward_weights: list[float] | None = None
    steps: int = 20
    prompts_per_step: int = 4
    group_size: int = 8
    temperature: float = 1.0
    max_tokens: int = 16
    lr: float = 1e-3
    kl_coef: float = 0.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    max_staleness: int = 0
    publish_every: int = 1
    engines: int = 1
    storage: str = "~/park-runs/rl"
    seed: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


def _learner(cfg: RLConfig) -> Any:
    import torch

    from workloads.rl.learner import GRPOLearner
    from workloads.train import modeling
    from workloads.train.config import TrainConfig
    from workloads.train.strategies import build_mesh, build_optimizer

    train = TrainConfig(
        accelerator="cpu",
        num_workers=1,
        model=cfg.model,
        init=cfg.init,
        seq_len=None,
        global_batch_size=cfg.prompts_per_step * cfg.group_size,
        strategy="ddp",
        seed=cfg.seed,
    )
    device = torch.device("cpu")
    model = modeling.build(
        train, device=device, mesh=build_mesh("cpu", 1), dtype=torch.float32, restoring=False
    )
    reference = None
    if cfg.kl_coef:
        reference = modeling.build(
            train, device=device, mesh=build_mesh("cpu", 1), dtype=torch.float32, restoring=False
        )
    optimizer = build_optimizer(model.module, lr=cfg.lr, weight_decay=0.0)
    settings = LossSettings(cfg.clip_low, cfg.clip_high, cfg.kl_coef)
    return GRPOLearner(
        model,
        optimizer,
        settings=settings,
        temperature=cfg.temperature,
        device=device,
        reference=reference,
    )


def run(
    cfg: RLConfig,
    prompts: list[Prompt],
    on_step: Callable[[int, RolloutPool], None] | None = None,
) -> list[dict[str, float]]:
    """The whole run; returns each step's metrics. Needs ``ray.init`` and a default process
    group (gloo, one rank) in this process. ``on_step(step, pool)`` runs after each step (a
    test kills an engine there)."""
    import os

    import ray

    from workloads.rl.learner import publish
    from workloads.rl.sync import PolicyStore

    if cfg.max_staleness < cfg.publish_every - 1:
        raise ValueError(
            f"publish_every {cfg.publish_every} makes rollouts up to {cfg.publish_every - 1} "
            f"updates stale, beyond max_staleness {cfg.max_staleness}: every round would drop"
        )
    root = os.path.expanduser(cfg.storage)
    rewards = Rewards(cfg.rewards, cfg.reward_weights)
    learner = _learner(cfg)
    store: Any = ray.remote(PolicyStore).options(num_cpus=0).remote(cfg.max_staleness, 1024)
    first, _ = publish(learner, root, store)  # version 0: the folder the engines start from
    engine_cls = ray.remote(RolloutEngine).options(num_cpus=1, max_restarts=2, max_task_retries=2)
    engines = [engine_cls.remote(first.path, cfg.engine_kwargs) for _ in range(cfg.engines)]
    try:
        pool = RolloutPool(engines, store)
        return _steps(cfg, prompts, learner, pool, rewards, root, on_step)
    finally:  # the engines hold GBs of memory: gone with the run, not with the Ray session
        for actor in [*engines, store]:
            ray.kill(actor)


def _steps(
    cfg: RLConfig,
    prompts: list[Prompt],
    learner: Any,
    pool: RolloutPool,
    rewards: Rewards,
    root: str,
    on_step: Callable[[int, RolloutPool], None] | None,
) -> list[dict[str, float]]:
    import ray
    import torch

    from workloads.rl.learner import collate, publish
    from workloads.rl.sync import Taken

    store = pool.store
    tokenizer = learner.model.source.tokenizer
    order = PromptOrder(prompts, cfg.seed)
    sampling = Sampling(cfg.group_size, cfg.temperature, cfg.max_tokens)
    history: list[dict[str, float]] = []
    for step in range(1, cfg.steps + 1):
        batch = order.next(cfg.prompts_per_step)
        synced = len(pool.sync_s)
        started = time.perf_counter()
        rollouts = pool.sample([chat_prompt(tokenizer, p.text) for p in batch], sampling)
        sample_s = time.perf_counter() - started
        for rollout in rollouts:
            ray.get(store.put.remote(rollout.version, rollout))
        taken: Taken = ray.get(store.take.remote(len(rollouts), learner.version))
        used = taken.items
        if len(used) != len(rollouts):  # a group lost a member to staleness: skip the round
            print(f"step {step}: {taken.dropped} stale rollouts dropped; resampling")
            continue
        scores = score(used, batch, rewards)
        advantages = group_advantages(torch.tensor(scores), cfg.group_size)
        metrics = round_metrics(used, scores, cfg.group_size, learner.version)
        metrics.update(learner.step(collate(used, advantages, tokenizer.pad_token_id), cfg.lr))
        if step % cfg.publish_every == 0 or step == cfg.steps:
            _, metrics["publish_s"] = publish(learner, root, store)
        tokens = sum(len(r.completion_ids) for r in used)
        metrics["rollout_tokens_per_s"] = tokens / max(sample_s, 1e-9)
        metrics["sync_s"] = sum(pool.sync_s[synced:])
        metrics["version"] = float(learner.version)
        history.append(metrics)
        print(_line(step, metrics), flush=True)
        if on_step is not None:
            on_step(step, pool)
    return history


def _line(step: int, m: dict[str, float]) -> str:
    return (
        f"step {step:3d}  reward {m['reward_mean']:.3f}±{m['reward_std']:.3f}  "
        f"kl {m.get('kl', 0.0):.4f}  clip {m['clip_fraction']:.3f}  "
        f"len {m['response_length']:.1f}  rollout {m['rollout_tokens_per_s']:.0f} tok/s  "
        f"learner {m['step_s']:.2f}s  sync {m['sync_s']:.2f}s  "
        f"staleness {m['staleness_max']:.0f}"
    )


def summary(history: list[dict[str, float]]) -> str:
    """``reward  <first> → <last>``: the mean reward of the first and the last step."""
    if not history:
        return "reward  n/a"
    return f"reward  {history[0]['reward_mean']:.2f} → {history[-1]['reward_mean']:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="jsonl/parquet/hf: prompts")
    parser.add_argument("--prompt-field", default="question")
    parser.add_argument("--answer-field", default="answer")
    for name, value in vars(RLConfig()).items():
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            flag = "--" + name.replace("_", "-")
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--reward", action="append", dest="reward_names")
    args = parser.parse_args(argv)
    names = {k for k, v in vars(RLConfig()).items() if isinstance(v, int | float | str)}
    cfg = RLConfig(**{k: v for k, v in vars(args).items() if k in names})
    cfg.rewards = args.reward_names or cfg.rewards

    import ray
    import torch.distributed as dist

    from workloads.protocol import free_port
    from workloads.rl.prompts import read_prompts

    fields = {"prompt_field": args.prompt_field, "answer_field": args.answer_field}
    prompts = read_prompts(args.data, **fields)
    ray.init(address="local", include_dashboard=False)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    started = time.perf_counter()
    try:
        history = run(cfg, prompts)
    finally:
        dist.destroy_process_group()
        ray.shutdown()
    print(f"{summary(history)}  ({time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
