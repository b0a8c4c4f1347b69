"""The one way a test builds what a method uses inside an RL step (`rollout.StepContext`)."""

from __future__ import annotations

from rlvr import rollout


def step_context(
  sampler, score_fn, tok=None, *, rl=None, encode=None, **fields
) -> rollout.StepContext:
  """A StepContext over `sampler` and `score_fn`: prompts and task texts encoded by `encode`
  (default: the tokenizer's own encode, else a text's characters as ids), padding with the
  `rl` (default RLConfig()); other StepContext fields as keywords."""
  if encode is None:
    encode = tok.encode if tok is not None else list
  return rollout.StepContext(
    sampler,
    score_fn,
    rl=rl if rl is not None else rollout.RLConfig(),
    encode=encode,
    encode_task=encode,
    **fields,
  )
