"""Training progress as text (no torch import: the sweep driver formats its trials' progress too)."""

from __future__ import annotations

from typing import Any


def format_duration(seconds: float) -> str:
    """``95`` -> ``1m35s``; ``3725`` -> ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def format_progress(progress: dict[str, Any]) -> str:
    """One line: ``step 340/1000 (34%) | loss 0.0812 | 212 samples/s | ETA 3m05s``."""
    total = progress.get("max_steps")
    parts = [
        f"step {progress['step']}/{total} ({100 * progress['step'] / total:.0f}%)"
        if total
        else f"step {progress['step']}"
    ]
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    if progress.get("samples_per_s"):
        parts.append(f"{progress['samples_per_s']:.0f} samples/s")
    if progress.get("eta_s") is not None:
        parts.append(f"ETA {format_duration(progress['eta_s'])}")
    return " | ".join(parts)
