"""Reward settings and per-response scores."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlvr.rewards.extraction import EXTRACTIONS


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How responses are turned into rewards.

  extraction: "boxed" (last `\\boxed{}`) or "answer_line" (last `Answer: ...`).
  integer_answers: answers are integers (AIME, DAPO-17k): compare as integers,
    and only an integer final answer counts as well-formed.
  timeout_s: time one answer may spend in math-verify before it scores 0.
  """

  extraction: str = "boxed"
  integer_answers: bool = False
  timeout_s: float = 5.0

  def __post_init__(self):
    if self.extraction not in EXTRACTIONS:
      raise ValueError(
        f"RewardConfig.extraction: unknown {self.extraction!r}; expected one of {EXTRACTIONS}"
      )
    if not isinstance(self.integer_answers, bool):
      raise TypeError(f"RewardConfig.integer_answers: expected bool, got {self.integer_answers!r}")
    if (
      isinstance(self.timeout_s, bool)
      or not isinstance(self.timeout_s, (int, float))
      or not self.timeout_s > 0
      or not math.isfinite(self.timeout_s)
    ):
      raise ValueError(
        f"RewardConfig.timeout_s: expected a positive finite number of seconds, "
        f"got {self.timeout_s!r}"
      )


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Per-response scores of one `score` call.

  rewards = correct as 1.0 / 0.0 (shaping terms such as QbQ's format bonus are
  added by `rlvr.shaping`); an item that timed out or crashed its worker scores 0
  (correct and well_formed False).
  timeouts / errors count those items.
  """

  rewards: np.ndarray
  correct: np.ndarray
  well_formed: np.ndarray
  extracted: list
  timeouts: int
  errors: int
