"""Offscreen MuJoCo rendering on CPU-only machines, shared by the simulated task families."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
# Mesa's software rasteriser (llvmpipe) splits every frame over one thread per core by default. For
# the small frames policies observe, handing work to those threads costs more than it saves
# (measured at 96x96: 0.7-1.0 ms of CPU per frame in the calling thread vs 1.1-1.3 ms threaded),
# and parallel rollout workers already use the cores. Read when the first GL context is created;
# set LP_NUM_THREADS yourself to override. GPU drivers ignore it.
os.environ.setdefault("LP_NUM_THREADS", "0")


def load_triton_first() -> None:
    """Load Triton (when installed) before the first GL context is created.

    Mesa's software renderer loads its own LLVM when a GL context is created; Triton (which torch
    pulls in) bundles another, and loading Triton after a context exists crashes the process
    (segmentation fault). Loading Triton first is safe.
    """
    if "triton.knobs" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    try:
        importlib.import_module("triton.knobs")
    except Exception:  # a broken Triton is torch's problem, not a reason to stop rendering
        pass


_THREAD_STATE = threading.local()


def thread_gl_context() -> Any:
    """This thread's offscreen GL context, created once per thread and made current.

    Creating a context costs ~1 s with software EGL, so it is reused. It is per thread because an
    EGL context can be current in one thread only: a process that renders from a new thread (Ray
    Tune runs each trial of a reused worker in a fresh thread) must not ask for the context an
    earlier thread left current (EGL_BAD_ACCESS).
    """
    context = getattr(_THREAD_STATE, "context", None)
    if context is None:
        load_triton_first()
        from mujoco.rendering.classic import gl_context

        context = _THREAD_STATE.context = gl_context.GLContext(64, 64)
    context.make_current()
    return context
