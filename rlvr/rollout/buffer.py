"""When and how a step's buffer is built: `Buffer` (one update's groups with the metrics
of building them), `build_buffer`, `staleness_metrics`, and `Buffers`, which builds each
step's buffer at the start of the step (`max_staleness` 0) or one step ahead, from the
weights the sampler holds while the previous update runs (`max_staleness` 1, one-step
off-policy), in a worker thread when the sampler runs apart from the learner.
`rlvr/rollout/buffer_file.py` keeps the one built ahead with a checkpoint."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import numpy as np

from rlvr.rollout.context import Rollout, RolloutStats
from rlvr.rollout.dynamic_sampling import rollout_metrics
from rlvr.rollout.types import Group


@dataclasses.dataclass
class Buffer:
  """The data of one step's update, with the metrics of building it (`build_buffer`).

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


def build_buffer(method, ctx: Rollout, step: int, version: int) -> Buffer:
  """method.buffer(ctx, step) on a fork of ctx, with its rollout metrics and stats."""
  ctx = ctx.fork()
  t0 = time.perf_counter()
  groups, m = method.buffer(ctx, step)
  stats = ctx.stats
  m = dict(m)
  if stats.reported is not None:
    m.update(rollout_metrics(*stats.reported, ctx.rl))
  m.update(stats.metrics())
  t1 = time.perf_counter()
  m["time_buffer"] = t1 - t0
  return Buffer(step, list(groups), m, version, t0, t1, stats)


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


class Buffers:
  """Where each step's buffer comes from, in step order.

  max_staleness 0: built when the step takes it, from the weights the step updates.
  max_staleness 1: the buffer of step t+1 is built from the weights the sampler holds
  during update t (version t, one behind the update that will use it); step 0's, and
  a resumed run's first when no buffer was saved ahead, are built when taken. With
  `overlap` the build runs in a worker thread while the update runs; without (an
  in-process sampler on the learner's devices, where nothing can overlap) it runs
  just before the update: the same buffers, the same updates, no time saved.
  The buffer built ahead is finished before the weight push (`finish_ahead`), so
  between steps nothing is in flight and `pending` is what a checkpoint saves.
  """

  def __init__(self, method, ctx: Rollout, *, overlap: bool = True, last_step: int | None = None):
    self.method, self.ctx = method, ctx
    self.ahead = ctx.rl.max_staleness == 1
    self.overlap, self.last_step = overlap, last_step
    self.pending: Buffer | None = None
    self.built: list[Buffer] = []  # the builds of the current step, for its timings
    self._future: concurrent.futures.Future | None = None
    self._pool = concurrent.futures.ThreadPoolExecutor(1, "rollouts") if overlap else None

  def take(self, step: int) -> Buffer:
    """Step `step`'s buffer: the one built ahead, else built now."""
    if self.pending is not None and self.pending.step == step:
      buf, self.pending, self.built = self.pending, None, []
      return buf
    self.pending = None
    buf = build_buffer(self.method, self.ctx, step, version=step)
    self.built = [buf]
    return buf

  def start_ahead(self, step: int) -> None:
    """Begins the next step's buffer from the weights the sampler holds now (version step)."""
    nxt = step + 1
    if not self.ahead or (self.last_step is not None and nxt >= self.last_step):
      return
    if self._pool is not None:
      self._future = self._pool.submit(build_buffer, self.method, self.ctx, nxt, step)
    else:
      self.pending = build_buffer(self.method, self.ctx, nxt, step)
      self.built.append(self.pending)

  def finish_ahead(self) -> None:
    """Waits for the buffer begun by `start_ahead` (errors in its build surface here)."""
    if self._future is not None:
      future, self._future = self._future, None
      self.pending = future.result()
      self.built.append(self.pending)

  def close(self) -> None:
    if self._future is not None:
      self._future.cancel()
      concurrent.futures.wait([self._future])
      self._future = None
    if self._pool is not None:
      self._pool.shutdown(wait=True)
