"""Training as one rank of a group whose processes something else started (a sweep trial's Ray workers).

Lightning's DDP launcher starts the other ranks itself by running the command line again; a sweep
trial cannot work that way, because its ranks are Ray actors, one per bundle of the trial's
placement group, possibly on several machines. :class:`AssignedRank` is the Lightning cluster
environment for that case: the launcher tells every process its rank, the world size and where rank
0 listens, and Lightning starts nothing. It is named in a training config like any plugin::

    trainer:
      strategy: ddp
      devices: 1
      num_nodes: 4          # one process per "node": the world size
      plugins:
        - class_path: demoscale.policies.distributed.AssignedRank
          init_args: {rank: 2, world_size: 4, main_address: 10.0.0.5, main_port: 29500}
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only


class AssignedRank(ClusterEnvironment):
    """Rank ``rank`` of ``world_size`` processes, one device each; rank 0 listens on
    ``main_address:main_port``. Each process counts as a node of one process (``trainer.num_nodes =
    world_size``, ``trainer.devices`` one device), so Lightning's global rank is ``rank``."""

    def __init__(self, rank: int, world_size: int, main_address: str, main_port: int) -> None:
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of {world_size} ranks")
        self._rank, self._world_size = int(rank), int(world_size)
        self._main_address, self._main_port = str(main_address), int(main_port)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return False  # only ever chosen explicitly, as a plugin

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        # Lightning computes num_nodes x devices; anything else means the trainer was set up for
        # another layout, and training would hang waiting for ranks that never come.
        if int(size) != self._world_size:
            raise ValueError(
                f"the trainer expects {size} processes but {self._world_size} were started: "
                "set trainer.num_nodes to the world size and trainer.devices to one device"
            )

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        if int(rank) != self._rank:
            raise ValueError(f"the trainer computed rank {rank} for the process started as rank {self._rank}")
        rank_zero_only.rank = self._rank  # Lightning's rank-zero-only logging and saving follow it

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self._rank


def assigned_rank_overrides(
    rank: int, world_size: int, main_address: str, main_port: int, device_index: int | None = None
) -> dict[str, Any]:
    """The training overrides (``demoscale.policies.train``) that make a process rank ``rank`` of
    ``world_size`` under :class:`AssignedRank`; ``device_index`` picks one of the visible GPUs."""
    return {
        "trainer.devices": [int(device_index)] if device_index is not None else 1,
        "trainer.num_nodes": int(world_size),
        "trainer.plugins": [
            {
                "class_path": f"{__name__}.AssignedRank",
                "init_args": {
                    "rank": int(rank),
                    "world_size": int(world_size),
                    "main_address": str(main_address),
                    "main_port": int(main_port),
                },
            }
        ],
    }
