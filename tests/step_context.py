"""The one way a test builds what a method uses inside an RL step (`rollout.Rollout`)."""

from __future__ import annotations

from rlvr import rollout


def step_context(sampler, score_fn, tok=None, *, rl=None, encode=None, **fields) -> rollout.Rollout:
  """A Rollout over `sampler` and `score_fn`: prompts and task texts encoded by `encode`
  (default: the tokenizer's own encode, else a text's characters as ids), padding with the
  `rl` (default RLConfig()); other Rollout fields as keywords."""
  if encode is None:
    encode = tok.encode if tok is not None else list
  return rollout.Rollout(
    sampler,
    score_fn,
    rl=rl if rl is not None else rollout.RLConfig(),
    encode=encode,
    encode_task=encode,
    **fields,
  )


class InOrder:
  """Prompts drawn in the given order (a `rollout.Draws`), round and round; `drawn` counts
  them."""

  def __init__(self, prompts):
    self.prompts, self.drawn = list(prompts), 0

  def draw(self, k: int) -> list:
    out = [self.prompts[(self.drawn + j) % len(self.prompts)] for j in range(k)]
    self.drawn += k
    return out
