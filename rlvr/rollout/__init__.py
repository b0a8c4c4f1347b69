"""The RL step every method shares, and what a method builds its buffer with.

`step.py` holds the step's path: `rl_step` (the buffer, the update, the weight push, the
timings), `Buffers` (when each step's `Buffer` is built) and `Rollout` (the sampler, the
environment, the scorer and shaping a method samples and scores through: `Rollout.gather`,
DAPO's dynamic sampling, and `Rollout.groups`). `types.py` holds `Prompt`, `Group`,
`RolloutStats` and `step_seed`; `dynamic_sampling.py` `NoSignalError` and the rollout
metrics; `buffer.py` the `Buffer` and its metrics. `RLConfig` (`config.py`) is the config
section `rl.loop`. `buffer_file.py` keeps a buffer built ahead with a checkpoint; `stats.py`
holds pass@k and the solve rates of groups.
"""

from rlvr.rollout.buffer import Buffer
from rlvr.rollout.config import RLConfig
from rlvr.rollout.dynamic_sampling import Draws, NoSignalError, no_signal_fix
from rlvr.rollout.step import Buffers, Rollout, rl_step
from rlvr.rollout.types import Group, Prompt, RolloutStats, step_seed

__all__ = [
  "Buffer",
  "Buffers",
  "Draws",
  "Group",
  "NoSignalError",
  "Prompt",
  "RLConfig",
  "Rollout",
  "RolloutStats",
  "no_signal_fix",
  "rl_step",
  "step_seed",
]
