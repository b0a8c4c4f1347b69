"""The contract every RL method meets, and the prompt pool most of them draw from.

A method builds the data of one update; `rlvr.rollout.rl_step` does the rest
(rollout metrics, batch, update, weight sync, timings) identically for all. A
method is made by a factory `make(settings, train) -> Method` from its `MethodSettings`
(its own section frozen and checked at launch, the run's seed and work dir) and the
training prompts, and must carry in `state()` everything a resumed run needs to continue where it
stopped (data position, curriculum stage, question bank); the runner stores that
dict in the checkpoint metadata and hands it back to `restore`.
"""

from __future__ import annotations

import abc
import dataclasses
import types
from typing import Any, Mapping, Sequence

from rlvr.data.stream import DataStream
from rlvr.rollout import Group, Prompt, Rollout

__all__ = ["Group", "Method", "MethodSettings", "Prompt", "PromptPool", "Rollout"]


@dataclasses.dataclass(frozen=True)
class MethodSettings:
  """What a method reads of the run's config, typed and checked once at launch
  (`methods.check`): its name, its own section as a frozen dataclass (`SvSConfig`,
  `CurriculumConfig`, `QbQConfig`; None for a method without one), and the run's settings
  it uses."""

  name: str
  section: Any = None
  seed: int = 0
  workdir: str = ""
  api_key: str = ""  # the sampler's (QbQ's URL teacher takes the same key)


class Method(abc.ABC):
  """One RL method: the runner and `rollout.rl_step` know methods only through this.

  A subclass names itself and builds buffers, states and restores; the other
  hooks default to "nothing of its own".
  """

  name: str  # also the name of its plot, `<name>.png`
  plot_keys: tuple[str, ...] = ()  # metrics of its own plot; () for none
  progress_keys: Mapping[str, str] = types.MappingProxyType({})  # progress label -> metric
  mark_key: str = ""  # a metric whose truthy steps its plot marks (e.g. the
  # curriculum's depth switches); "" marks nothing

  @abc.abstractmethod
  def buffer(self, ctx: Rollout, step: int) -> tuple[list[Group], dict[str, float]]:
    """The scored groups of one update (may be empty: the update is skipped) + metrics.

    The rollouts the step's metrics describe go to `ctx.report_rollouts`
    (`Rollout.gather` reports its own).
    """

  @abc.abstractmethod
  def state(self) -> dict[str, Any]:
    """JSON-able state that a resumed run needs."""

  @abc.abstractmethod
  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues from a `state()` dict saved by an earlier invocation."""

  def resets_optimizer(self, step: int) -> bool:
    """True where the step's update starts from fresh optimizer moments (QbQ: every round)."""
    del step
    return False

  def summary(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Fields this method adds to summary.json, from all metrics rows of the run."""
    del rows
    return {}


class PromptPool:
  """Endless seeded shuffles of a fixed list of prompts, resumable (`rlvr.data.stream.DataStream`)."""

  def __init__(self, prompts: Sequence[Prompt], seed: int):
    if not prompts:
      raise ValueError("PromptPool: no prompts to draw from")
    self.prompts = list(prompts)
    self.stream = DataStream(len(self.prompts), seed)

  def draw(self, k: int) -> list[Prompt]:
    return [self.prompts[i] for i in self.stream.next_indices(k)]

  def state(self) -> dict[str, int]:
    return self.stream.state()

  def restore(self, state: Mapping[str, Any]) -> None:
    if int(state["n"]) != len(self.prompts):
      raise ValueError(
        f"PromptPool: checkpoint was written for {state['n']} prompts, this run "
        f"has {len(self.prompts)}; resume with the same data"
      )
    self.stream = DataStream.from_state(state)
