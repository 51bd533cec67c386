"""Throughput and MFU, and the ``PARK_METRICS`` / ``PARK_RESULT`` lines the CLI streams.

MFU = achieved model FLOP/s / (devices * peak FLOP/s per device). A TPU's peak comes only from
the infra catalog, through the contract: the RayJob passes ``--peak-tflops-per-device`` (918 on
v6e, 1153.5 per TensorCore on TPU7x). The table below covers GPUs, which the catalog does not;
a TPU run without the flag reports no MFU rather than a second, possibly stale, copy.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from workloads.protocol import METRICS_PREFIX, RESULT_PREFIX, format_line, parse_line

__all__ = ["METRICS_PREFIX", "RESULT_PREFIX", "ThroughputMeter", "emit", "mfu", "parse_line"]

# Dense bf16 TFLOP/s per device from vendors' data sheets (no sparsity). Keys are matched as
# substrings of the lower-cased device name, first match wins (so "h100 pcie" before "h100").
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989.0),
    ("h100 pcie", 756.0),
    ("h100", 989.0),
    ("a100", 312.0),
    ("l40s", 362.0),
    ("l4", 121.0),
)


def peak_tflops(device_name: str) -> float | None:
    """Peak bf16 TFLOP/s for a GPU name such as ``NVIDIA H100 80GB HBM3``; None for a TPU
    (its peak is the catalog's, by flag) or a CPU."""
    lowered = device_name.lower()
    for key, value in PEAK_BF16_TFLOPS:
        if key in lowered:
            return value
    return None


def device_name(device: torch.device, tpu_accelerator_type: str | None = None) -> str:
    """A name :func:`peak_tflops` understands, for the device this worker trains on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "tpu":
        return tpu_accelerator_type or "tpu"
    return device.type


def mfu(
    flops_per_token: float,
    tokens_per_s: float,
    num_devices: int,
    peak_tflops_per_device: float | None,
) -> float | None:
    """Model FLOPs utilization in [0, 1], or None when the peak is unknown (e.g. CPU)."""
    if not peak_tflops_per_device or num_devices <= 0:
        return None
    return flops_per_token * tokens_per_s / (num_devices * peak_tflops_per_device * 1e12)


class ThroughputMeter:
    """Accumulates loss on the device between reports; one sync per report, none per step."""

    def __init__(
        self,
        *,
        tokens_per_step: int,
        world_size: int,
        flops_per_token: float,
        peak_tflops_per_device: float | None,
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.world_size = world_size
        self.flops_per_token = flops_per_token
        self.peak = peak_tflops_per_device
        self._loss_sum: torch.Tensor | None = None
        self._steps = 0
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        detached = loss.detach().float()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        self._steps += 1

    def flush(self, step: int) -> dict[str, Any]:
        """Metrics over the steps since the last flush; the loss is averaged over all ranks."""
        assert self._loss_sum is not None, "flush() before any add()"
        loss = self._loss_sum / self._steps
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss = loss / self.world_size
        loss_value = float(loss.item())  # waits for the device: the window's time is real
        elapsed = time.perf_counter() - self._start
        tokens_per_s = self.tokens_per_step * self._steps / elapsed
        result = {
            "step": step,
            "loss": loss_value,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_worker": tokens_per_s / self.world_size,
            "mfu": mfu(self.flops_per_token, tokens_per_s, self.world_size, self.peak),
            "step_time_s": elapsed / self._steps,
        }
        self._loss_sum, self._steps = None, 0
        self.restart_clock()
        return result

    def restart_clock(self) -> None:
        """Start the next window now (after a report or checkpoint, which are not step time)."""
        self._start = time.perf_counter()


def emit(prefix: str, payload: Mapping[str, Any]) -> None:
    """Write one progress line to stdout, once.

    Not ``print``: Ray Train patches ``print`` on its workers into a logger whose line reaches
    the driver on both stdout and stderr, so a reader of the merged job log saw it twice.
    """
    sys.stdout.write(format_line(prefix, payload) + "\n")
    sys.stdout.flush()
