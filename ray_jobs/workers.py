"""A trial trained by several workers: one Ray actor per bundle of the trial's placement group.

With ``resources.workers: N`` a trial reserves, through Tune, one placement group of N bundles of
``{cpu, gpu}`` (and an empty head bundle: the trial's own process only coordinates). The trial
starts one :class:`RankWorker` actor in each bundle; every actor runs the same
``demoscale.policies.train`` call as a one-worker trial, as one rank of a Lightning DDP run (gloo on
CPUs, NCCL on GPUs) whose ranks are assigned by :class:`demoscale.policies.distributed.AssignedRank`.
Rank 0 writes the checkpoints into the trial's folder, so a multi-worker trial leaves what a
one-worker trial leaves, and resumes from it the same way.

Why not Ray Train's ``TorchTrainer``: in Ray 2.60 (Train V2) a ``TorchTrainer`` started inside a
Tune trial creates its own placement group for its workers, outside the trial's, so Tune would
reserve only the trial's driver and could not gang-schedule a trial's N workers; trials started
together then compete for worker groups, and a group waiting for resources gives up after
``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (60 s) and tries again. Its ``ray.train.report`` is also a barrier of
all ranks, so the trial's time-based progress could not go through it. The actors here do only
what a trial needs: reserve with the trial, rendezvous, train, report.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

# How often the trial asks rank 0 for its training progress while the ranks train.
POLL_EVERY_S = 5.0


class RankWorker:
    """One rank of a multi-worker trial (a Ray actor; ``max_concurrency=2`` so that the trial can
    read the progress of rank 0 while it trains)."""

    def __init__(self) -> None:
        self._progress: dict[str, Any] | None = None

    def placement(self) -> dict[str, Any]:
        """Where this actor runs: node id and IP, the GPUs Ray gave it."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
            "pid": os.getpid(),
        }

    def free_port(self) -> int:
        """A port free on this node, for rank 0's rendezvous (the process group's store)."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            return int(probe.getsockname()[1])

    def progress(self) -> dict[str, Any] | None:
        return self._progress

    def train(
        self,
        train_fn: Callable[..., Any] | None,
        policy_config: str,
        overrides: dict[str, Any],
        threads: int,
        visible_gpus: list[str] | None,
    ) -> dict[str, Any]:
        """Train as the rank named in ``overrides`` (:func:`assigned_rank_overrides`); returns this
        rank's record (rank, world size, samples and batches it trained on) and, on rank 0, the
        training result."""
        if visible_gpus:
            # Every rank of a node sees all of the node's GPUs of this trial (NCCL then uses direct
            # GPU-to-GPU paths) and trains on its own one, named by index in trainer.devices.
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible_gpus)
        import torch

        # Ranks sharing a machine would each take every core; each gets its bundle's CPUs.
        torch.set_num_threads(max(1, threads))
        record = _RankRecord()
        if train_fn is None:
            from demoscale.policies import train as default_train
            from demoscale.policies.callbacks import TrainingProgress

            worker = self

            class ProgressToTrial(TrainingProgress):
                def report(self, snapshot: dict[str, Any]) -> None:
                    worker._progress = snapshot

            callbacks = [record.callback(), ProgressToTrial(every_s=POLL_EVERY_S)]
            result = default_train(policy_config, overrides=overrides, callbacks=callbacks)
        else:
            result = train_fn(policy_config, overrides=overrides)
        trained = asdict(result) if is_dataclass(result) else dict(result or {})
        return {**record.summary(), "pid": os.getpid(), "result": trained}


class _RankRecord:
    """What one rank trained on, counted by a Lightning callback on that rank."""

    def __init__(self) -> None:
        self.samples = 0
        self.batches = 0
        self.rank = 0
        self.world_size = 1
        self.steps = 0

    def callback(self) -> Any:
        import lightning as L

        record = self

        class CountSamples(L.Callback):
            def on_train_batch_end(
                self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int
            ) -> None:
                record.samples += int(batch["action"].shape[0])
                record.batches += 1
                record.rank, record.world_size = int(trainer.global_rank), int(trainer.world_size)
                record.steps = int(trainer.global_step)

        return CountSamples()

    def summary(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "samples": self.samples,
            "batches": self.batches,
            "steps": self.steps,
        }


def train_on_workers(
    policy_config: str,
    overrides: dict[str, Any],
    workers: int,
    cpu: float,
    gpu: float,
    train_fn: Callable[..., Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train with ``workers`` ranks in the bundles of the current trial's placement group.

    Returns (rank 0's training result as a dict, one record per rank). The first rank to fail
    fails the call, after every rank's actor is killed (the others would wait in a collective).
    """
    import ray
    from demoscale.policies.distributed import assigned_rank_overrides
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.get_current_placement_group()
    if group is None:
        raise RuntimeError(
            "a multi-worker trial trains in its Tune placement group (resources.workers > 1); "
            "none is current in this process"
        )
    options: dict[str, Any] = {"num_cpus": cpu, "max_concurrency": 2}
    if gpu:
        options["num_gpus"] = gpu
    worker_class = ray.remote(RankWorker)
    strategy = {} if _names_strategy(policy_config, overrides) else {"trainer.strategy": "ddp"}
    actors = [
        worker_class.options(
            **options,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=index, placement_group_capture_child_tasks=False
            ),
        ).remote()
        for index in range(workers)
    ]
    try:
        placements = ray.get([actor.placement.remote() for actor in actors])
        address, port = placements[0]["ip"], ray.get(actors[0].free_port.remote())
        futures = []
        for rank, (actor, placement) in enumerate(zip(actors, placements, strict=True)):
            visible, device = _node_gpus(placements, placement)
            rank_overrides = {
                **strategy,
                **overrides,
                **assigned_rank_overrides(rank, workers, address, port, device),
            }
            threads = int(cpu) if cpu >= 1 else 1
            futures.append(actor.train.remote(train_fn, policy_config, rank_overrides, threads, visible))
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_EVERY_S)
            for ref in done:
                ray.get(ref)  # a failed rank raises here, at once
            if progress is not None:
                snapshot = ray.get(actors[0].progress.remote())
                if snapshot is not None:
                    progress(snapshot)
        records = ray.get(futures)
    finally:
        for actor in actors:
            ray.kill(actor)
    for record, placement in zip(records, placements, strict=True):
        record["node_ip"] = placement["ip"]
    result = records[0]["result"]
    return result, [{k: v for k, v in record.items() if k != "result"} for record in records]


def _node_gpus(
    placements: list[dict[str, Any]], placement: dict[str, Any]
) -> tuple[list[str] | None, int | None]:
    """(the GPUs every rank on this rank's node sees, this rank's index among them); (None, None)
    without GPUs. Ray gives each actor only its own GPU; sharing the node's GPUs of the trial lets
    NCCL go GPU to GPU instead of through host memory."""
    own = placement["gpu_ids"]
    if not own:
        return None, None
    node = sorted(
        {gpu for other in placements if other["node_id"] == placement["node_id"] for gpu in other["gpu_ids"]},
        key=lambda gpu: (len(gpu), gpu),
    )
    return node, node.index(own[0])


def _names_strategy(policy_config: str, overrides: dict[str, Any]) -> bool:
    """Whether the training config or its overrides choose a strategy (FSDP2, say); else the ranks
    run Lightning's DDP."""
    import yaml

    chosen = overrides.get("trainer.strategy")
    if chosen is None:
        try:
            with open(policy_config) as handle:
                chosen = ((yaml.safe_load(handle) or {}).get("trainer") or {}).get("strategy")
        except (OSError, yaml.YAMLError, AttributeError):
            chosen = None
    return chosen not in (None, "auto")
