"""The RL step every method shares, and what a method builds its buffer with.

`rl_step` (`step.py`) is one step of any method: the buffer the method builds, its
rollout metrics, the update, the weight push, the timings. A method builds its buffer
through the step's `Rollout` (`context.py`: the sampler, the environment, the scorer and
shaping; `Rollout.groups`, `step_seed`) from `Prompt`s into scored `Group`s (`types.py`),
plain GRPO by dynamic sampling
(`dynamic_sampling.py`: `gather_groups`, `NoSignalError`); `Buffers` (`buffer.py`) says
when each step's `Buffer` is built. `RLConfig` (`config.py`) is the config section
`rl.loop`. `buffer_file.py` keeps a buffer built ahead with a checkpoint; `stats.py` holds
pass@k and the solve rates of groups.
"""

from rlvr.rollout.buffer import Buffer, Buffers, build_buffer
from rlvr.rollout.config import RLConfig
from rlvr.rollout.context import Rollout, step_seed
from rlvr.rollout.dynamic_sampling import Draws, NoSignalError, gather_groups, no_signal_fix
from rlvr.rollout.step import rl_step
from rlvr.rollout.types import Group, Prompt

__all__ = [
  "Buffer",
  "Draws",
  "Group",
  "NoSignalError",
  "Prompt",
  "RLConfig",
  "Buffers",
  "Rollout",
  "build_buffer",
  "gather_groups",
  "no_signal_fix",
  "rl_step",
  "step_seed",
]
