"""resin_runner: out-of-process model runners for the Resin engine.

The engine (Go) freezes a BatchPlan per step and sends it over the runner protocol
(docs/runner-protocol.md in the Resin repository); a runner executes it and answers with a
StepResult. This package holds the protocol codec (resin_runner.wire), a Runner base class
with its serve loop (resin_runner.runner) and a reference Llama-family runner in numpy
(python -m resin_runner.llama --weights DIR).
"""

from .wire import (
    VERSION,
    CacheGroup,
    CacheOp,
    Plan,
    Release,
    RunnerInfo,
    StepResult,
    Tables,
    WireError,
)
from .runner import Runner, StepFailed, serve

__all__ = [
    "VERSION",
    "CacheGroup",
    "CacheOp",
    "Plan",
    "Release",
    "Runner",
    "RunnerInfo",
    "StepFailed",
    "StepResult",
    "Tables",
    "WireError",
    "serve",
]
