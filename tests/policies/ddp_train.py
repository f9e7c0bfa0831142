"""Train the test family of ``test_third_family.py`` once: on one process, with Lightning DDP, or
with FSDP2 (Lightning's ModelParallelStrategy, data parallel only).

    python tests/policies/ddp_train.py STORE OUT STRATEGY DEVICES BATCH_SIZE [CKPT_PATH]

STRATEGY is ``single``, ``ddp`` or ``fsdp2``.
Used by ``test_distributed.py`` as a real process: Lightning's DDP launcher starts the other ranks
by running this same command again, so the family must be registered here, not in the test. The
family's loss draws no random numbers, so a run on W processes with micro-batch B must follow the
one-process run with batch W x B step by step. Every rank writes ``OUT/rank<r>.json``: per step,
its loss and a fingerprint of each sample it trained on, the samples it validated on, and at the
end the sharding plan of the network and its EMA copy (FSDP units; local and full parameter sizes).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning as L
import torch
from demoscale.policies import lightning_module, register_family, train
from test_third_family import LINEAR_CHUNK, _config

MAX_STEPS = 30
GLOBAL_BATCH = 16


def fingerprints(batch: dict[str, Any]) -> list[str]:
    """One short hash per sample of the batch (its observation window and action chunk)."""
    parts = [batch["action"], *(batch["obs"][key] for key in sorted(batch["obs"]))]
    rows = [torch.cat([part[i].flatten().float() for part in parts]) for i in range(len(batch["action"]))]
    return [hashlib.sha1(row.numpy().tobytes()).hexdigest()[:16] for row in rows]


class Recorder(L.Callback):
    """Writes what this rank trained on, step by step."""

    def __init__(self, out: Path) -> None:
        self.out, self.steps, self.validated = out, [], []

    def on_train_batch_end(
        self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.steps.append(
            {"step": int(trainer.global_step), "loss": float(loss), "samples": fingerprints(batch)}
        )

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.validated.extend(fingerprints(batch))

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        record = {"world_size": trainer.world_size, "steps": self.steps, "validated": self.validated}
        record["plan"] = {"policy": sharding_plan(module.policy)}
        if module.ema is not None:
            record["plan"]["ema"] = sharding_plan(module.ema.averaged)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def sharding_plan(network: torch.nn.Module) -> dict[str, Any]:
    """Which modules are FSDP units, and each parameter's local and full sizes on this rank."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    units = sorted(name or "<root>" for name, m in network.named_modules() if isinstance(m, FSDPModule))
    params = {
        name: {
            "dtensor": isinstance(p, DTensor),
            "local": int(p.to_local().numel()) if isinstance(p, DTensor) else int(p.numel()),
            "full": int(p.numel()),
        }
        for name, p in network.named_parameters()
    }
    return {"units": units, "params": params}


def strategy(name: str, devices: int) -> Any:
    """The trainer's ``strategy`` entry for a strategy name."""
    if name == "fsdp2":
        return {
            "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
            # One full checkpoint file, as a single process writes, so load_policy reads it.
            "init_args": {
                "data_parallel_size": devices,
                "tensor_parallel_size": 1,
                "save_distributed_checkpoint": False,
            },
        }
    return {"single": "auto", "ddp": "ddp"}[name]


def main(
    store: str, out: str, strategy_name: str, devices: int, batch_size: int, ckpt_path: str | None = None
) -> None:
    torch.set_num_threads(1)  # one core per rank
    if strategy_name == "fsdp2":
        # The test family's linear layer is tiny: lower the plan's threshold so that the per-child
        # FSDP units of a large network are made here too.
        lightning_module.FSDP_CHILD_MIN_PARAMS = 0
    register_family(LINEAR_CHUNK, replace=True)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    config = _config(store, str(folder / "run"))
    config["trainer"].update(
        max_steps=MAX_STEPS,
        val_check_interval=10,
        limit_val_batches=2,
        devices=devices,  # in the config, not a --flag: the CPU accelerator wants an int, flags give "2"
        strategy=strategy(strategy_name, devices),
    )
    config["model"]["init_args"]["global_batch_size"] = GLOBAL_BATCH
    overrides: dict[str, Any] = {
        "data.batch_size": batch_size,
        "checkpoint.every_n_train_steps": 10,
        "checkpoint.save_top_k": -1,
        "checkpoint.dirpath": str(folder / "checkpoints"),
    }
    if ckpt_path:
        overrides["ckpt_path"] = ckpt_path
    train(config, overrides=overrides, callbacks=[Recorder(folder)])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
