"""A method defined outside the library, for the seam test in tests/rollout/test_rl_step.py.

Plain GRPO plus a counter of its own that must survive a resume: each step
reports how many buffers this method has built over the whole run and where
its data stream stands, both restored from the checkpoint on a rerun.
"""

from __future__ import annotations

from rlvr.methods import plain


class Counting(plain.Plain):
  name = "counting"
  plot_keys = ("counting_calls", "counting_position")
  progress_keys = {"calls": "counting_calls"}

  def __init__(self, train, seed):
    super().__init__(train, seed)
    self.calls = 0

  def buffer(self, ctx, step):
    groups, m = super().buffer(ctx, step)
    self.calls += 1
    return groups, dict(m, counting_calls=self.calls, counting_position=self.pool.stream.position)

  def state(self):
    return dict(super().state(), calls=self.calls)

  def restore(self, state):
    super().restore(state)
    self.calls = int(state["calls"])

  def summary(self, rows):
    return {"counting_total_calls": self.calls}


def make(settings, train):
  return Counting(train, settings.seed)
