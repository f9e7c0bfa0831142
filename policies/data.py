"""The DataModule the policy CLI trains from: ``EpisodeDataModule`` + policy-driven window + exact resume.

Two additions over :class:`demoscale.datasets.EpisodeDataModule`:

- the observation window, action keys and horizon default to the policy's own (so a YAML names them
  once, under ``model``); when given explicitly they must agree with the policy;
- resuming mid-epoch continues the data exactly where the checkpoint left it: the sampler is the
  same (seed, epoch) permutation, and the batches the restored loop already trained on are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from demoscale.datasets import EpisodeDataModule
from demoscale.datasets.sampler import DEFAULT_PRELOAD_BYTES
from torch.utils.data import DataLoader, DistributedSampler


class ResumableShuffleSampler(DistributedSampler):
    """This rank's share of the (seed, epoch) permutation of ``range(n)``; ``skip_next(k)`` drops the
    first k indices of that share once.

    The permutation is the same on every rank; rank ``r`` of ``world_size`` takes its entries
    ``r, r + W, r + 2W, ...`` (the tail that does not fill every rank is dropped), so batch ``k`` of the
    W ranks together holds exactly batch ``k`` of a single process with a W times larger batch. It is
    a ``DistributedSampler`` so Lightning uses it as it is under DDP instead of wrapping it (a wrapper
    would re-split an already skipped list and break an exact resume).
    """

    def __init__(self, n: int, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of {world_size} ranks")
        super().__init__(range(int(n)), num_replicas=int(world_size), rank=int(rank), shuffle=False)
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0
        self.num_samples = self.n // self.num_replicas
        self.total_size = self.num_samples * self.num_replicas
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_next(self, n_indices: int) -> None:
        self._skip = int(n_indices)

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        share = order[self.rank : self.total_size : self.num_replicas]
        start, self._skip = self._skip, 0
        return iter(share[start:].tolist())

    def __len__(self) -> int:
        return self.num_samples


class PolicyDataModule(EpisodeDataModule):
    """Training/validation windows for a policy; see the module docstring.

    Args:
        store: store location (directory, .zip or fsspec URL).
        obs_offsets, action_keys, horizon: the window; ``None`` = take the policy's.
        batch_size: the micro-batch (per device); gradient accumulation makes up the global batch.
        waypoint_keys: keys of the next-waypoint frame for a waypoint head (default: the policy's).
        target_keys: keys the policy learns to predict without observing them (default: the policy's).
        num_workers, val_fraction, seed, episodes, drop_last, preload_bytes: as in
            :class:`~demoscale.datasets.EpisodeDataModule` (``episodes`` selects a subset).
    """

    def __init__(
        self,
        store: str,
        obs_offsets: dict[str, list[int]] | None = None,
        action_keys: list[str] | None = None,
        horizon: int | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        seed: int = 0,
        episodes: list[int] | None = None,
        drop_last: bool = True,
        preload_bytes: int = DEFAULT_PRELOAD_BYTES,
        waypoint_keys: list[str] | None = None,
        target_keys: list[str] | None = None,
    ) -> None:
        super().__init__(
            store,
            obs_offsets or {},
            action_keys or [],
            horizon=horizon or 1,
            batch_size=batch_size,
            num_workers=num_workers,
            val_fraction=val_fraction,
            seed=seed,
            episodes=episodes,
            drop_last=drop_last,
            preload_bytes=preload_bytes,
            waypoint_keys=waypoint_keys,
            target_keys=target_keys,
        )
        self._explicit = {
            "obs_offsets": obs_offsets,
            "action_keys": action_keys,
            "horizon": horizon,
            "waypoint_keys": waypoint_keys,
            "target_keys": target_keys,
        }
        self._window_resolved = False

    def _resolve_window(self) -> None:
        if self._window_resolved:
            return
        module = self.trainer.lightning_module if self.trainer is not None else None
        window = module.data_window() if module is not None and hasattr(module, "data_window") else None
        if window is None:
            missing = [
                name
                for name, value in self._explicit.items()
                if value is None and name not in ("waypoint_keys", "target_keys")
            ]
            if missing:
                raise ValueError(f"data.{missing} must be given when the model does not define the window")
        else:
            for name, wanted in window.items():
                given = self._explicit[name]
                if given is not None and given != wanted:
                    raise ValueError(
                        f"data.{name}={given!r} disagrees with the policy's {name}={wanted!r}; "
                        f"leave data.{name} unset to use the policy's"
                    )
            self.obs_offsets = {k: [int(o) for o in v] for k, v in window["obs_offsets"].items()}
            self.action_keys = list(window["action_keys"])
            self.horizon = int(window["horizon"])
            self.waypoint_keys = list(window.get("waypoint_keys") or self.waypoint_keys)
            self.target_keys = list(window.get("target_keys") or self.target_keys)
        self._window_resolved = True

    def setup(self, stage: str | None = None) -> None:
        self._resolve_window()
        super().setup(stage)

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        assert self.train_dataset is not None
        trainer: Any = self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = ResumableShuffleSampler(len(self.train_dataset), self.seed, rank, world_size)
        if self.drop_last and len(sampler) < self.batch_size:
            # Otherwise every epoch is empty and training "finishes" without a single step.
            raise ValueError(
                f"the training split has {len(self.train_dataset)} windows, fewer than one batch of "
                f"{self.batch_size} on each of {world_size} rank(s): use more episodes, a smaller "
                "data.batch_size, or data.drop_last=false"
            )
        skip = self._batches_already_trained(len(sampler))
        if skip:
            sampler.skip_next(skip * self.batch_size)
        return self._loader(self.train_dataset, sampler, self.drop_last)

    def _batches_already_trained(self, windows_per_rank: int) -> int:
        """Batches of the current epoch a resumed loop has already consumed (0 on a fresh start)."""
        trainer: Any = self.trainer
        if trainer is None or getattr(trainer, "ckpt_path", None) is None:
            return 0
        processed = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        n_batches = (
            windows_per_rank // self.batch_size if self.drop_last else -(-windows_per_rank // self.batch_size)
        )
        return processed if 0 < processed < n_batches else 0
