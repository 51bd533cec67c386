"""What the served export must answer in a `park local` run: transformers' greedy reply from the
export (the reference), the model checks `park validate` makes, and the endpoint's reply held
to the reference."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from infra.tools.local.outcome import LocalRun, Outcome
from infra.tools.local.profile import FACT_QUESTION_INDEX
from infra.tools.local.ray_head import LocalRunError


def reference(run: LocalRun) -> None:
    """transformers' greedy reply from the export to a question of the training data, the
    answer the endpoint must give (workloads/train/generate.py, in a subprocess: torch)."""
    from workloads.train.inputs import facts

    outcome, console = run.outcome, run.console
    export = (outcome.trained or {}).get("export_path")
    if not export or not Path(export, "config.json").is_file():
        return
    outcome.export = str(export)
    outcome.question, outcome.learned = list(facts.questions().items())[FACT_QUESTION_INDEX]
    done = subprocess.run(
        [sys.executable, "-m", "workloads.train.generate", outcome.export, outcome.question],
        capture_output=True,
        text=True,
        cwd=run.run_dir,
        timeout=600,
    )
    if done.returncode != 0:
        raise LocalRunError(
            f"transformers could not load the export {export}: {done.stderr[-800:]}"
        )
    outcome.reference = done.stdout.rstrip("\n").split("\t", 1)[-1]
    console.print(
        f"export {outcome.export}: transformers answers {outcome.question!r} with "
        f"{outcome.reference!r} (greedy; learned answer {outcome.learned!r})",
        highlight=False,
        soft_wrap=True,
    )


def compare(outcome: Outcome, console: Console) -> None:
    """The endpoint serves the trained weights: its greedy reply is transformers' own."""
    reply = (outcome.reply or "").strip()
    console.print(
        f"served completion of {outcome.question!r}: {reply!r}; transformers from the export: "
        f"{outcome.reference!r}; learned answer: {outcome.learned!r}",
        highlight=False,
        soft_wrap=True,
    )
    if reply != outcome.reference:
        raise LocalRunError(
            f"the endpoint answered {reply!r}, transformers {outcome.reference!r} from the same "
            f"export {outcome.export}: the served weights are not the trained ones"
        )
    console.print(
        "the endpoint serves the trained export"
        + (": it gives the learned answer" if reply == outcome.learned else ""),
        highlight=False,
    )


def check_local_model(folder: str, console: Console) -> None:
    """The served models' checks that hold on any hardware, run on the folder served here:
    its config.json read as `park validate` reads a model's, and the engine's architectures."""
    from infra import model_lookup
    from infra.rules.workloads import servable_problems

    found = model_lookup.lookup(folder)
    if found.facts is None:
        raise LocalRunError(f"the model to serve, {folder}: {found.error or found.reason}")
    problems = servable_problems(found.facts)
    if problems:
        raise LocalRunError(f"the model to serve, {folder}: {'; '.join(problems)}")
    facts = found.facts
    console.print(
        f"model checked ({folder}): {facts.architecture}, {facts.layers} layers, "
        f"{facts.attention_heads} heads / {facts.kv_heads} KV heads, {facts.max_positions} "
        "positions: one the pinned vLLM serves",
        highlight=False,
        soft_wrap=True,
    )


def check_export(run: LocalRun) -> None:
    """transformers' reply from the export, then validate's model checks on it."""
    try:
        reference(run)
        if run.outcome.export:
            check_local_model(run.outcome.export, run.console)
    except LocalRunError as err:
        run.console.print(f"[red]{escape(str(err))}[/]", highlight=False)
        run.outcome.reference = None


def parameter_count(folder: str | Path) -> int | None:
    """The parameters in an exported folder's safetensors files, from their headers (each
    tensor's shape; nothing loaded), or None when it has none readable."""
    total, found = 0, False
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with path.open("rb") as file:
                (size,) = struct.unpack("<Q", file.read(8))
                header = json.loads(file.read(size))
        except (OSError, ValueError, struct.error):
            return None
        for name, tensor in header.items():
            if name != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= int(dim)
                total += count
                found = True
    return total if found else None


def stand_in(folder: str | Path, model: str | None) -> str:
    """What a local run trained instead of the stack's `model`, in a few words."""
    count = parameter_count(folder)
    size = f" ({count / 1e6:.1f}M params)" if count else ""
    return f"tiny Llama{size}" + (f" standing in for {model}" if model else "")
