"""The GRPO loop of one learner rank; rank 0 also drives the rollouts.

Ray 2.60's TorchTrainer runs this function on every learner worker (workloads/rl/launcher.py),
so the learner is Ray Train's: one worker per chip, its process group (gloo, nccl, tpu_dist
through the trainer's TPU bridge), its restarts and its checkpoint registry. Rank 0 is the
coordinator: it creates the PolicyStore and the vLLM engines as Ray actors (on the rollout
pool, by their resources), runs the rounds, scores them and hands every rank its share of the
batch (``scatter_object_list`` on a gloo group). Coordinating from rank 0 rather than from the
job's driver keeps one control flow: a driver would need a second channel into the
TorchTrainer's workers every step (Ray Train's only driver-to-worker path is the dataset
iterator, built for a fixed dataset, not per-step on-policy batches). Per step:

1. rank 0: the round sampled for this step is collected (an engine that died during it costs
   only its share, sampled again), checked against the staleness bound in one store call each
   way, and scored (rewards concurrently, each call bounded by ``--reward-timeout-s``);
   advantages within each group (scaled by ``--scale-rewards``); with ``--dynamic-sampling N``
   groups whose rewards are all equal are replaced from at most N more rounds;
2. with ``--overlap`` (one-step-off, as verl's and TRL's async trainers), rank 0 launches the
   next round as soon as this one's rollouts are in and fresh, before scoring them (after the
   extra rounds with ``--dynamic-sampling``), on the weights the engines hold, so the engines
   sample step n+1 while rank 0 scores and the learner takes step n; those rollouts are one
   update stale (launching before the scoring publishes nothing sooner), and the loss's
   importance weights (workloads/rl/grpo.py) correct for it. Without it, the next round starts
   after the publish, on the new weights (on policy up to the engine/learner mismatch);
3. every rank: one GRPO step on its share, with the engines' log-probabilities as the
   sampler's;
4. every rank: publish the new version (every ``publish_every`` steps): bf16 buckets into Ray's
   object store (or a folder, ``--weight-sync folder``); rank 0 starts every engine host's
   receiver pulling it at once, behind the sampling.

Progress is a ``PARK_METRICS`` line per step (reward mean/spread, KL, the learner/sampler
mismatch and the importance weights, response length, rollout tokens/s, learner step time,
publish and sync time and bytes, staleness; with ``--eval-every`` the held-out prompts' greedy
reward), after, with ``--probe-prompts N``, one line of
the starting policy's greedy answers to the data's first N prompts, scored; checkpoints are
the trainer's DCP ones with the prompt order and the policy version beside them; the final
policy is exported where training exports (``<storage>/<run>/export/final``) for serving.
The learner, the engines and rank 0's driver are built in workloads/rl/parts.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from workloads.protocol import METRICS_PREFIX, training_export_path
from workloads.rl import parts
from workloads.rl.config import RLRunConfig
from workloads.rl.config_check import validate
from workloads.rl.grpo import group_advantages
from workloads.rl.learner import GRPOLearner, RolloutBatch, collate
from workloads.rl.prompts import Prompt, Scores, flat_groups, round_metrics, score
from workloads.rl.publish import Published, publish_buckets, write_folder
from workloads.rl.rollout import Rollout, RolloutPool, Round, SyncStats
from workloads.rl.sync import PolicyStore, Put, StoreFull, Taken
from workloads.train.distributed.runenv import RayTrainEnv, RunEnv
from workloads.train.outputs import checkpointing
from workloads.train.run.metrics import emit

OnStep = Callable[[int, RolloutPool], None]
Pending = tuple[list[Prompt], Round]  # a launched round: its prompts and its calls


def _store_name(cfg: RLRunConfig, rank: int, world: int, group: Any) -> str:
    """The PolicyStore actor's name, rank 0's pick sent to every rank: rank 0 creates it, the
    others offer it buckets. A new one per attempt: a restarted attempt's store must not meet
    the name of the one that died with the last."""
    name = [f"park-rl-store-{cfg.run_name}-{uuid.uuid4().hex[:8]}" if rank == 0 else ""]
    if world > 1:
        dist.broadcast_object_list(name, src=0, group=group)
    return name[0]


def _scatter(share: list[Any], rank: int, world: int, group: Any) -> Any:
    """Rank 0's list of per-rank objects; each rank gets its own."""
    if world == 1:
        return share[0]
    out: list[Any] = [None]
    dist.scatter_object_list(out, share if rank == 0 else None, src=0, group=group)
    return out[0]


def _publish(
    cfg: RLRunConfig, learner: GRPOLearner, root: str, store: Any, start: int, group: Any
) -> Published:
    """The new version to the engines' side: buckets in Ray's object store, or a folder."""
    if cfg.weight_sync == "folder":
        return write_folder(learner, root, store, keep=2, protect=start)
    return publish_buckets(learner, store, group=group)


def rl_train(
    cfg: RLRunConfig, env: RunEnv, on_step: OnStep | None = None
) -> list[dict[str, float]]:
    """The run on this rank until ``cfg.steps``; the default process group must be initialized.
    Returns rank 0's per-step metrics (empty elsewhere). ``on_step(step, pool)`` runs on rank 0
    after each step (a test kills an engine there)."""
    import ray

    validate(cfg)
    rank, world = env.rank, env.world_size
    group = checkpointing.coordination_group(env.device.type)
    objects = group if group is not None else None  # gloo: object collectives work on it
    root = f"{_storage_root(cfg)}/{cfg.run_name}"
    state = checkpointing.TrainState()
    data_state: dict[str, Any] = {}
    with env.latest_checkpoint() as directory:
        learner = parts.build_learner(cfg, env, directory)
        if directory is not None:
            state = checkpointing.load(directory, learner.model.module, learner.optimizer, group)
            data_state = checkpointing.load_data_state(directory, rank, state.step)
            state.resumes += 1
    learner.version = start = state.step
    store = None
    name = _store_name(cfg, rank, world, objects)
    if rank == 0:
        store = (
            ray.remote(PolicyStore)
            .options(num_cpus=0, name=name)
            .remote(cfg.max_staleness, cfg.store_capacity)
        )
    # The start folder: the engines start (and Ray restarts them) from it; kept all run long.
    first = write_folder(learner, root, store, keep=0)
    if rank != 0 and cfg.weight_sync == "ray" and ray.is_initialized():
        store = ray.get_actor(name)
    driver = None
    if rank == 0:
        assert first.policy is not None
        driver = parts.start_driver(cfg, learner, first.policy, store)
        if "order" in data_state:
            driver.order.load_state_dict(data_state["order"])
        if cfg.probe_prompts and state.step == 0:  # the starting policy's answers, scored
            emit(METRICS_PREFIX, {"probe": driver.probe(cfg)})
    history: list[dict[str, float]] = []
    pending: Pending | None = None
    try:
        step = state.step
        while step < cfg.steps:
            ready = None
            if driver is not None:
                ahead = cfg.overlap and step + 1 < cfg.steps
                pending = pending or driver.launch(cfg)
                ready, pending = _finish(cfg, driver, pending, learner, world, ahead=ahead)
                if ahead and pending is None and ready[0][0] is not None:
                    pending = driver.launch(cfg)  # after the dynamic-sampling rounds
            batch, metrics = _scatter(
                [(b, ready[1]) for b in ready[0]] if ready else [], rank, world, objects
            )
            if batch is None:  # a group lost a member to staleness: sample again
                continue
            step += 1
            metrics.update(learner.step(batch, cfg.lr))
            if step % cfg.publish_every == 0 or step == cfg.steps:
                published = _publish(cfg, learner, root, store, start, group)
                metrics.update(publish_s=published.seconds, publish_bytes=float(published.nbytes))
                if driver is not None and published.policy is not None and step < cfg.steps:
                    driver.pool.prestage(published.policy)  # the hosts pull it now
            if driver is not None and cfg.eval_every and step % cfg.eval_every == 0:
                metrics.update(driver.evaluate(cfg, learner.version))  # held-out, greedy
            state.step = step
            metrics.update(step=step, version=float(learner.version), resumes=state.resumes)
            if rank == 0:
                first_reward = data_state.setdefault("reward_first", metrics["reward_mean"])
                metrics["reward_first"] = first_reward
                history.append(metrics)
                if step % cfg.report_every == 0 or step == cfg.steps:
                    emit(METRICS_PREFIX, metrics)
            last = step == cfg.steps
            if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                order = driver.order.state_dict() if driver else data_state.get("order")
                with env.checkpoint_folder(step) as folder:
                    checkpointing.save(
                        folder,
                        learner.model.module,
                        learner.optimizer,
                        state,
                        group,
                        {
                            "order": order,
                            "policy_version": learner.version,
                            "reward_first": data_state.get("reward_first"),
                        },
                    )
                    if last and cfg.export:
                        metrics["export_path"] = export_final(cfg, learner, group)
                    env.report(metrics, folder, step)
            if driver is not None and on_step is not None:
                on_step(step, driver.pool)
        if state.step >= cfg.steps and cfg.export and not history and rank == 0:
            print(f"run {cfg.run_name} already at step {state.step}: nothing to do")
    finally:  # the engines hold GBs of memory: gone with the run, not with the Ray session
        if driver is not None:
            driver.close()
    return history


def _collect(
    cfg: RLRunConfig,
    driver: parts.Driver,
    pending: Pending,
    learner: GRPOLearner,
    then: Callable[[], None] | None = None,
) -> tuple[list[Rollout], Scores, SyncStats, float] | None:
    """Rank 0: one round collected, checked against the staleness bound and scored (None when
    a rollout was stale: the round must be sampled again). ``then`` runs once the round is in
    and fresh, before the scoring: the next round's launch, so the engines sample while the
    rewards are computed."""
    import ray

    prompts, round_ = pending
    rollouts, sync = driver.pool.finish(round_)
    sample_s = time.perf_counter() - round_.started
    put: Put = ray.get(driver.store.put_many.remote([(r.version, r) for r in rollouts]))
    if put.full:
        raise StoreFull(
            f"the rollout store refused {put.full} of {len(rollouts)} rollouts: it holds "
            f"{cfg.store_capacity} ({cfg.batch} completions per step x 2 rounds)"
        )
    taken: Taken = ray.get(driver.store.take.remote(len(rollouts), learner.version))
    used = taken.items
    if len(used) != len(rollouts):
        print(f"{put.stale + taken.dropped} stale rollouts dropped; sampling the round again",
              flush=True)  # fmt: skip
        return None
    if then is not None:
        then()
    scored = score(used, prompts, driver.rewards, timeout_s=cfg.reward_timeout_s)
    return used, scored, sync, sample_s


def _informative(
    cfg: RLRunConfig,
    driver: parts.Driver,
    learner: GRPOLearner,
    used: list[Rollout],
    values: list[float],
) -> tuple[list[Rollout], list[float], int]:
    """Dynamic sampling (DAPO): the groups whose rewards are not all equal, topped up from at
    most ``--dynamic-sampling`` more rounds; short of a full step, flat groups fill it (their
    advantages are zero). Returns the step's rollouts, their rewards, the extra rounds."""
    size = cfg.group_size
    keep: list[tuple[list[Rollout], list[float]]] = []
    flat: list[tuple[list[Rollout], list[float]]] = []
    rounds = 0
    while True:
        for index, is_flat in enumerate(flat_groups(values, size)):
            group = (
                used[index * size : (index + 1) * size],
                values[index * size : (index + 1) * size],
            )
            (flat if is_flat else keep).append(group)
        if len(keep) >= cfg.prompts_per_step or rounds >= cfg.dynamic_sampling:
            break
        rounds += 1
        got = _collect(cfg, driver, driver.launch(cfg), learner)
        used, values = ([], []) if got is None else (got[0], got[1].values)
    chosen = (keep + flat)[: cfg.prompts_per_step]
    return [r for g in chosen for r in g[0]], [v for g in chosen for v in g[1]], rounds


def _finish(
    cfg: RLRunConfig,
    driver: parts.Driver,
    pending: Pending,
    learner: GRPOLearner,
    world: int,
    *,
    ahead: bool = False,
) -> tuple[tuple[list[RolloutBatch | None], dict[str, float]], Pending | None]:
    """Rank 0: collect, check, score and split one step's batch into ``world`` shares (all
    None when the round must be sampled again); with ``ahead``, also the next round, launched
    as soon as this one is in (before its scoring). With ``--dynamic-sampling`` the next round
    waits for the step's extra rounds instead: on the engines' actors it would queue ahead of
    them."""
    launched: list[Pending] = []
    early = ahead and not cfg.dynamic_sampling
    then = (lambda: launched.append(driver.launch(cfg))) if early else None
    got = _collect(cfg, driver, pending, learner, then)
    following = launched[0] if launched else None
    if got is None:
        return ([None] * world, {}), following
    used, scored, sync, sample_s = got
    metrics = round_metrics(used, scored.values, cfg.group_size, learner.version)
    tokens = sum(len(r.completion_ids) for r in used)
    values = scored.values
    if cfg.dynamic_sampling:
        used, values, rounds = _informative(cfg, driver, learner, used, values)
        metrics["resample_rounds"] = float(rounds)
        metrics["flat_groups_used"] = (
            sum(flat_groups(values, cfg.group_size)) / cfg.prompts_per_step
        )
    advantages = group_advantages(torch.tensor(values), cfg.group_size, scale=cfg.scale_rewards)
    metrics.update(
        rollout_tokens_per_s=tokens / max(sample_s, 1e-9),
        sync_s=sync.seconds,
        sync_bytes=float(sync.nbytes),
        reward_s=scored.seconds,
        reward_timeouts=float(scored.timeouts),
        rewards_nonfinite=float(scored.nonfinite),
    )
    source = learner.model.source
    pad = 0 if source is None else source.tokenizer.pad_token_id
    full = collate(used, advantages, int(pad or 0), mask_truncated=cfg.mask_truncated)
    share = len(used) // world  # the config makes the batch a multiple of the workers
    return ([full.rows(i * share, (i + 1) * share) for i in range(world)], metrics), following


def export_final(cfg: RLRunConfig, learner: GRPOLearner, group: Any) -> str:
    """The final policy as a Hugging Face folder where training's goes (serving reads it)."""
    from workloads.train.outputs.export import export_model

    destination = training_export_path(cfg.storage_path, cfg.run_name)
    assert learner.model.source is not None
    export_model(
        learner.model.inner,
        destination,
        source=learner.model.source,
        dtype=torch.float32,
        max_shard_bytes=2 * 1024**3,
        metadata={"run_name": cfg.run_name, "policy_version": learner.version,
                  "model": cfg.model, "objective": "grpo", "data": cfg.data},
        group=group,
    )  # fmt: skip
    return destination


def _storage_root(cfg: RLRunConfig) -> str:
    """Where policy versions go: the bucket through the pods' mount on GKE (the engines, on
    other pods with the same mount, read the folder vLLM is given), else the path itself."""
    from workloads.train import storage

    path = cfg.storage_path
    local = storage.local_path(path)
    return str(local) if local is not None else path


def summary(history: list[dict[str, float]]) -> str:
    """``reward  <first> → <last>``: the mean reward of the first and the last step."""
    if not history:
        return "reward  n/a"
    line = f"reward  {history[0]['reward_mean']:.2f} → {history[-1]['reward_mean']:.2f}"
    evals = [m["eval_reward"] for m in history if "eval_reward" in m]
    return line + (f"   eval reward  {evals[0]:.2f} → {evals[-1]:.2f}" if evals else "")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry on every learner worker."""
    history = rl_train(RLRunConfig.from_dict(config), RayTrainEnv())
    if history:
        emit(METRICS_PREFIX, {"summary": summary(history)})
