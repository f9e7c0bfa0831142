"""Lightning DDP on the CPU (gloo, 2 processes), run as real processes by ``ddp_train.py``.

Two ranks with micro-batch 8 must train exactly as one process with batch 16: each step the ranks
see disjoint samples that together are the one-process batch, the mean of their losses is its loss,
and the final weights agree. A DDP run resumed from a mid-epoch checkpoint ends where the
uninterrupted run ends, and its checkpoint loads in a single process with ``load_policy``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from demoscale.policies import load_policy, register_family
from demoscale.policies.families import unregister_family
from test_third_family import LINEAR_CHUNK

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_train.py")


def _train(
    store: Path, out: Path, strategy: str, devices: int, batch_size: int, ckpt_path: Path | None = None
) -> list[dict]:
    command = [sys.executable, str(SCRIPT), str(store), str(out), strategy, str(devices), str(batch_size)]
    result = subprocess.run(
        [*command, *([str(ckpt_path)] if ckpt_path else [])], capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(devices)]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


class Runs:
    """Training runs of the module, each made once when a test first asks for it."""

    def __init__(self, store: Path, root: Path) -> None:
        self.store, self.root, self.made = store, root, {}

    def __call__(self, strategy: str) -> list[dict]:
        if strategy not in self.made:
            devices, batch_size = (1, 16) if strategy == "single" else (2, 8)
            self.made[strategy] = _train(self.store, self.root / strategy, strategy, devices, batch_size)
        return self.made[strategy]

    def weights(self, strategy: str) -> dict[str, torch.Tensor]:
        self(strategy)
        return _weights(self.root / strategy / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def runs(tabletop_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tabletop_store, tmp_path_factory.mktemp("distributed"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_train_as_one_process_with_the_same_global_batch(runs: Runs, strategy: str) -> None:
    (single,), (rank0, rank1) = runs("single"), runs(strategy)
    assert (single["world_size"], rank0["world_size"], rank1["world_size"]) == (1, 2, 2)
    assert len(single["steps"]) == len(rank0["steps"]) == len(rank1["steps"]) == 30
    for one, first, second in zip(single["steps"], rank0["steps"], rank1["steps"], strict=True):
        assert one["step"] == first["step"] == second["step"]
        assert len(first["samples"]) == len(second["samples"]) == 8
        assert not set(first["samples"]) & set(second["samples"]), one["step"]
        assert sorted(first["samples"] + second["samples"]) == sorted(one["samples"]), one["step"]
        assert (first["loss"] + second["loss"]) / 2 == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
    # Validation episodes are never trained on, by either rank.
    trained = {sample for rank in (rank0, rank1) for step in rank["steps"] for sample in step["samples"]}
    validated = set(rank0["validated"]) | set(rank1["validated"])
    assert validated and not validated & trained
    one_process, two_ranks = runs.weights("single"), runs.weights(strategy)
    assert one_process.keys() == two_ranks.keys()
    for key, value in one_process.items():
        torch.testing.assert_close(two_ranks[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_fsdp2_shards_the_network_and_its_ema_copy_by_one_plan(runs: Runs) -> None:
    """Every parameter of the trained network and of its EMA copy is a DTensor whose two local
    shards make up the whole; the large children and the root are FSDP units, in both copies."""
    ranks = runs("fsdp2")
    for copy in ("policy", "ema"):
        plans = [rank["plan"][copy] for rank in ranks]
        assert plans[0]["units"] == plans[1]["units"], copy
        assert "<root>" in plans[0]["units"] and "linear" in plans[0]["units"], plans[0]["units"]
        assert plans[0]["params"], copy
        for name, param in plans[0]["params"].items():
            assert param["dtensor"], f"{copy}.{name} is not sharded"
            assert param["local"] + plans[1]["params"][name]["local"] == param["full"], f"{copy}.{name}"
            assert 0 < param["local"] < param["full"] or param["full"] == 1, f"{copy}.{name}"
    assert ranks[0]["plan"]["ema"]["units"] == ranks[0]["plan"]["policy"]["units"]
    # DDP replicates: nothing is sharded.
    assert not any(p["dtensor"] for p in runs("ddp")[0]["plan"]["policy"]["params"].values())


def test_a_ddp_run_resumed_mid_epoch_ends_as_the_uninterrupted_one(runs: Runs, tabletop_store: Path) -> None:
    uninterrupted, root = runs("ddp"), runs.root
    middle = root / "ddp" / "checkpoints" / "step0000010.ckpt"  # 3 training episodes: 4 batches an epoch
    resumed = _train(tabletop_store, root / "resumed", "ddp", devices=2, batch_size=8, ckpt_path=middle)
    for rank, record in enumerate(resumed):
        assert [step["step"] for step in record["steps"]] == list(range(11, 31))
        expected_samples = [step["samples"] for step in uninterrupted[rank]["steps"][10:]]
        assert [step["samples"] for step in record["steps"]] == expected_samples
    final, expected = (
        _weights(root / "resumed" / "checkpoints" / "last.ckpt"),
        _weights(root / "ddp" / "checkpoints" / "last.ckpt"),
    )
    for key, value in expected.items():
        torch.testing.assert_close(final[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_multi_process_checkpoint_loads_and_acts_in_one_process(
    runs: Runs, tabletop_store: Path, strategy: str
) -> None:
    from demoscale.datasets import EpisodeStore
    from demoscale.policies.executor import HierarchicalExecutor, ReplayEnv

    register_family(LINEAR_CHUNK)
    try:
        runs(strategy)
        policy = load_policy(runs.root / strategy / "checkpoints" / "last.ckpt")
        assert policy.family == "linear_chunk" and policy.action_dim == 7
        execution = HierarchicalExecutor(policy).run(
            ReplayEnv(EpisodeStore.open(tabletop_store), episode=0), n_steps=4
        )
        assert execution.steps == 4
    finally:
        unregister_family(LINEAR_CHUNK.name)
