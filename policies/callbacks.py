"""Training callbacks: progress lines, instantaneous throughput / data-wait / MFU logging, scheduled GC."""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import lightning as L
import torch
from demoscale.policies.progress import format_progress
from lightning.pytorch.callbacks import ModelCheckpoint


class ThroughputLogger(L.Callback):
    """Every ``log_every_n_steps`` batches, log the *instantaneous* (not smoothed) numbers of the last batch.

    - ``perf/samples_per_s``: micro-batch samples / wall time from the end of the previous batch to
      the end of this one;
    - ``perf/data_wait_fraction``: the part of that time spent before ``on_train_batch_start``
      (fetching the batch from the DataLoader and moving it to the device);
    - ``perf/mfu`` (CUDA only): model FLOPs per second (measured once with torch's FLOP counter on
      the first batch, forward + backward) over the device's peak (``peak_flops`` or Lightning's
      table of known GPUs).

    The medians over the run are kept in ``summary`` (used by ``train()`` and the benchmark).
    """

    def __init__(self, log_every_n_steps: int = 50, peak_flops: float | None = None):
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.peak_flops = peak_flops
        self._last_end: float | None = None
        self._start: float | None = None
        self._flops_per_sample: float | None = None
        self.samples_per_s: list[float] = []
        self.data_wait_fraction: list[float] = []
        self.samples_seen = 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        batch_size = int(batch["action"].shape[0]) * trainer.world_size
        self.samples_seen += batch_size
        if self._last_end is not None and self._start is not None:
            step_time = now - self._last_end
            wait = max(0.0, self._start - self._last_end)
            self.samples_per_s.append(batch_size / step_time)
            self.data_wait_fraction.append(wait / step_time)
            if batch_idx % self.log_every_n_steps == 0:
                metrics = {
                    "perf/samples_per_s": self.samples_per_s[-1],
                    "perf/data_wait_fraction": self.data_wait_fraction[-1],
                }
                mfu = self._mfu(trainer, pl_module, batch)
                if mfu is not None:
                    metrics["perf/mfu"] = mfu * 1.0
                pl_module.log_dict(metrics, batch_size=batch_size)
        self._last_end = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = time.perf_counter()

    def _mfu(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> float | None:
        if pl_module.device.type != "cuda" or not self.samples_per_s:
            return None
        if self._flops_per_sample is None:
            from torch.utils.flop_counter import FlopCounterMode

            # Forward FLOPs counted once without touching gradients; backward ~ 2x forward.
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                pl_module.policy.compute_losses(batch)
            self._flops_per_sample = 3 * counter.get_total_flops() / int(batch["action"].shape[0])
        peak = self.peak_flops
        if peak is None:
            from lightning.fabric.utilities.throughput import get_available_flops

            dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float32
            peak = get_available_flops(pl_module.device, dtype)
        if not peak:
            return None
        per_device = self.samples_per_s[-1] / trainer.world_size
        return self._flops_per_sample * per_device / peak

    @property
    def summary(self) -> dict[str, float]:
        def median(values: list[float]) -> float:
            return float(torch.tensor(values).median()) if values else float("nan")

        return {
            "samples_per_s_median": median(self.samples_per_s),
            "data_wait_fraction_median": median(self.data_wait_fraction),
        }


class TrainingProgress(L.Callback):
    """Every ``every_s`` seconds (and at the end), report steps, loss, samples/s and the ETA.

    Lightning's progress bar counts batches of an epoch; a step-budgeted run (``max_steps``) wants
    the steps left and the time to the end, also in logs and pipes where a bar does not draw.
    :meth:`report` receives a dict (``step``, ``max_steps``, ``loss``, ``samples_per_s``,
    ``elapsed_s``, ``eta_s``, ``done``) and prints :func:`format_progress` to stderr; a subclass
    sends it elsewhere (a sweep trial sends it to the sweep's display). ``every_s <= 0`` turns it
    off. Only rank 0 reports.
    """

    def __init__(self, every_s: float = 30.0):
        super().__init__()
        self.every_s = every_s
        self._started = 0.0
        self._last = 0.0
        self._first_step = 0
        self._samples = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = self._last = time.perf_counter()
        self._first_step = int(trainer.global_step)
        self._samples = 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += int(batch["action"].shape[0]) * trainer.world_size
        now = time.perf_counter()
        if self.every_s > 0 and now - self._last >= self.every_s:
            self._last = now
            self._emit(trainer, done=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_s > 0:
            self._emit(trainer, done=True)

    def snapshot(self, trainer: L.Trainer, done: bool = False) -> dict[str, Any]:
        elapsed = time.perf_counter() - self._started
        step = int(trainer.global_step)
        max_steps = int(trainer.max_steps) if trainer.max_steps and trainer.max_steps > 0 else None
        steps_done = step - self._first_step
        eta = None
        if done:
            eta = 0.0
        elif max_steps and steps_done > 0:
            eta = (max_steps - step) * elapsed / steps_done
        loss = trainer.callback_metrics.get("train/loss")
        return {
            "step": step,
            "max_steps": max_steps,
            "loss": None if loss is None else float(loss),
            "samples_per_s": self._samples / elapsed if elapsed > 0 else None,
            "elapsed_s": elapsed,
            "eta_s": eta,
            "done": done,
        }

    def _emit(self, trainer: L.Trainer, done: bool) -> None:
        if trainer.global_rank != 0:
            return
        self.report(self.snapshot(trainer, done))

    def report(self, progress: dict[str, Any]) -> None:
        print(f"train: {format_progress(progress)}", file=sys.stderr, flush=True)


class ScheduledGC(L.Callback):
    """Disable automatic garbage collection during training and collect every ``every_n_steps`` batches.

    Python's automatic collection pauses at unpredictable times (per process, so ranks stall each
    other); collecting at fixed intervals makes the pauses rare and synchronous.
    """

    def __init__(self, every_n_steps: int = 500, generation: int = 1):
        super().__init__()
        self.every_n_steps = every_n_steps
        self.generation = generation
        self._was_enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % self.every_n_steps == 0:
            gc.collect(self.generation)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._was_enabled:
            gc.enable()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._was_enabled:
            gc.enable()


class PolicyCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that always writes ``last.ckpt`` at the final step of training.

    Lightning's own ``save_last`` writes at the end only when no ``last`` was written earlier in the
    run, so steps after the last periodic checkpoint would be lost.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (
            self.save_last
            and self._last_global_step_saved != trainer.global_step
            and not trainer.sanity_checking
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._last_global_step_saved = trainer.global_step
        super().on_train_end(trainer, pl_module)
