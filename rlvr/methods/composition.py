"""Composition-RL: GRPO with dynamic sampling on composed problems, depth by depth.

The composed problems are data (built offline by `launch/compose.py` with an
assistant model, or by construction for the arithmetic task,
`rlvr.data.tasks.composed`); what the method adds is the depth curriculum of the
paper: train on depth 1 until solve_all is high (or a fixed number of steps),
then on depth 2, then on depth 3 (`synthesis.composition.Curriculum`). A
prompt's depth is read from its source name, which ends in `-d<K>` ("composed-d2",
as both builders write it); prompts without one are depth 1. The stage, the
steps in it and the switch points are method state: a resumed run continues at
the same depth. The RL step itself is plain GRPO, unchanged (paper: lr 1e-6,
G = 8, token-mean loss, dynamic sampling).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr.common import settings
from rlvr.common.panel import Panel
from rlvr.methods.base import Group, Method, MethodSettings, Prompt, PromptPool, Rollout
from rlvr.rollout import stats
from synthesis.composition import Curriculum, CurriculumConfig

_DEPTH = re.compile(r"-d(\d+)$")


def depth_of(prompt: Prompt) -> int:
  """The composition depth a prompt's source name carries (`...-d<K>`), else 1."""
  m = _DEPTH.search(prompt.source or "")
  return int(m.group(1)) if m else 1


class Composition(Method):
  """Draws the current depth's prompts; moves to the next depth by the curriculum rule."""

  name = "composition"
  plot_keys: tuple[str | Panel, ...] = (
    "depth",
    Panel(
      "Training groups all or none correct",
      "fraction of groups",
      (("solve_all", "all correct (too easy)"), ("solve_none", "none correct (too hard)")),
    ),
    "accuracy",
  )
  progress_keys: Mapping[str, str] = {"depth": "depth"}
  mark_key = "depth_switch"  # the plot marks the steps where a new depth begins

  def __init__(self, train: Sequence[Prompt], curriculum: CurriculumConfig, seed: int):
    by_depth: dict[int, list[Prompt]] = {}
    for p in train:
      by_depth.setdefault(depth_of(p), []).append(p)
    missing = [d for d in curriculum.depths if d not in by_depth]
    if missing:
      have = {d: len(v) for d, v in sorted(by_depth.items())}
      raise ValueError(
        f"composition.depths: no training prompts of depth {missing} (have "
        f"{have}); sources must end in -d<K>, e.g. 'composed-d2'"
      )
    self.pools = {d: PromptPool(by_depth[d], seed + d) for d in curriculum.depths}
    self.curriculum = Curriculum(curriculum)

  def buffer(self, ctx: Rollout, step: int) -> tuple[list[Group], dict[str, float]]:
    depth = self.curriculum.depth
    kept, sampled, _ = ctx.gather(self.pools[depth], step)
    solve_all = stats.group_stats(np.stack([g.correct for g in sampled]))["solve_all"]
    switched = self.curriculum.record(solve_all)
    return kept, {"depth": depth, "depth_switch": int(switched)}

  def state(self) -> dict[str, Any]:
    return {
      "pools": {str(d): p.state() for d, p in self.pools.items()},
      "curriculum": self.curriculum.state(),
    }

  def restore(self, state: Mapping[str, Any]) -> None:
    for d, s in state["pools"].items():
      self.pools[int(d)].restore(s)
    self.curriculum.restore(state["curriculum"])

  def summary(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    depths = [r["depth"] for r in rows if "depth" in r]
    return {
      "depth_per_step": depths,
      "depth_switch_steps": [r["step"] + 1 for r in rows if r.get("depth_switch")],
      "final_depth": self.curriculum.depth,
    }


def check(cfg) -> CurriculumConfig:
  return settings.frozen(CurriculumConfig, cfg.composition, prefix="composition.")


def make(settings: MethodSettings, train: Sequence[Prompt]) -> Composition:
  return Composition(train, settings.section, settings.seed)
