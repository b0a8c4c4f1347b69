"""Plain RLVR: GRPO with dynamic sampling over the training prompts (DAPO-style)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlvr.methods.base import Group, Method, MethodSettings, Prompt, PromptPool, Rollout


class Plain(Method):
  """Draws prompts, samples G responses each, keeps groups with mixed rewards."""

  name = "rlvr"

  def __init__(self, train: Sequence[Prompt], seed: int):
    self.pool = PromptPool(train, seed)

  def buffer(self, ctx: Rollout, step: int) -> tuple[list[Group], dict[str, float]]:
    kept, _, _ = ctx.gather(self.pool, step)
    return kept, {}

  def state(self) -> dict[str, Any]:
    return {"data": self.pool.state()}

  def restore(self, state: Mapping[str, Any]) -> None:
    self.pool.restore(state["data"])


def make(settings: MethodSettings, train: Sequence[Prompt]) -> Plain:
  return Plain(train, settings.seed)
