"""A step's buffer: `Buffer` (one update's groups with the metrics of building them), how old
its samples are (`staleness_metrics`) and the step's wall-clock metrics (`step_timings`).
`step.Buffers` builds them; `rlvr/rollout/buffer_file.py` keeps the one built ahead with a
checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rlvr.rollout.types import Group, RolloutStats


@dataclasses.dataclass
class Buffer:
  """The data of one step's update, with the metrics of building it (`step.Buffers.take`).

  version: the sampler's weight version when the build began; started / ended:
  `time.perf_counter()` stamps of the build; stats: what its calls cost and met
  (`RolloutStats`: its generated tokens, the groups its rollout metrics describe...).
  A buffer read back from a checkpoint (`buffer_file`) has empty stats.
  """

  step: int
  groups: list[Group]
  metrics: dict[str, Any]
  version: int
  started: float = 0.0
  ended: float = 0.0
  stats: RolloutStats = dataclasses.field(default_factory=RolloutStats)


def staleness_metrics(buf: Buffer) -> dict[str, float]:
  """Update step minus the weight version each sample was drawn from (the sampler's tag
  when it gives one, else the version it held when the build began)."""
  ages = [
    buf.step - (c.weight_version if c.weight_version is not None else buf.version)
    for g in buf.groups
    for c in g.completions
  ]
  if not ages:
    return {}
  return {"staleness_mean": float(np.mean(ages)), "staleness_max": int(max(ages))}


def step_timings(clock: dict[str, float], built: list[Buffer]) -> dict[str, float]:
  """A step's wall-clock metrics from its phase stamps and the buffers built during it:
  time_update, time_sync, time_step, time_learner_idle (the step's time outside the update),
  time_sampler_idle (outside generate calls), overlap_frac (the share of the step when a
  buffer build and the update ran at once) and tokens_per_s (tokens generated during the
  step per second)."""
  step_s = clock["end"] - clock["start"]
  update = (clock["update"], clock["update_end"])
  overlap = lambda b: max(0.0, min(b.ended, update[1]) - max(b.started, update[0]))
  return {
    "time_update": update[1] - update[0],
    "time_sync": clock["end"] - clock["sync"],
    "time_step": step_s,
    "time_learner_idle": step_s - (update[1] - update[0]),
    "time_sampler_idle": step_s - sum(b.metrics["time_sample"] for b in built),
    "overlap_frac": sum(overlap(b) for b in built) / step_s,
    "tokens_per_s": sum(b.stats.generated_tokens for b in built) / step_s,
  }
