"""The race's reward (bench/race_trl.py), one function in both frameworks' forms: 1.0 when a
response's last \\boxed{...} holds the reference integer, else 0.0. Standard library only:
the TRL side imports it from its own environment."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def boxed_integer(text: str) -> int | None:
  """The integer in the last \\boxed{...} of `text` (None: no boxed integer)."""
  found = _BOXED.findall(text)
  return int(found[-1]) if found else None


def score(responses: list[str], answers: list[str], prompts: list[str]) -> list[float]:
  """rlvr's form (`reward.domain = "bench.race_reward:score"`)."""
  return [float(boxed_integer(r) == int(a)) for r, a in zip(responses, answers)]


def trl_reward(completions: list, answer: list[str], **_) -> list[float]:
  """TRL's form: conversational completions ([{"role": "assistant", "content": ...}]) and
  the dataset's `answer` column."""
  texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
  return score(texts, answer, [])
