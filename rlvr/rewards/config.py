"""Reward settings and per-response scores."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlvr.rewards import custom
from rlvr.rewards.code.config import CodeRewardConfig
from rlvr.rewards.extraction import EXTRACTIONS

DOMAINS = ("math", "code")
_FLOAT32_MAX = float(
  np.finfo(np.float32).max
)  # what a reference answer is: a final answer, or a program's tests


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How responses are turned into rewards.

  domain: "math" (the response's final answer against the reference answer, math-verify),
    "code" (the response's program run against the problem's tests in a sandbox: the
    reference answer is the tests, `rlvr.rewards.code`), or "package.module:attribute", a
    reward of the user's own: a score function (rlvr's, verl's `compute_score` or TRL's
    `reward_func` form, told apart by their parameters; several comma-separated ones are
    summed), or a factory of a Verifier (`rlvr.rewards.custom`); `rlvr.rewards.verifiers`.
  code: the code reward's settings (sandbox, limits, workers), used by domain "code".
  extraction: "boxed" (last `\\boxed{}`) or "answer_line" (last `Answer: ...`).
  integer_answers: answers are integers (AIME, DAPO-17k): compare as integers,
    and only an integer final answer counts as well-formed.
  timeout_s: time one answer may spend in math-verify before it scores 0.
  fn_timeout_s: time one call of a user's score function may take (a batched call, or one
    verl-form call of one response) before its responses score 0 (verdict fn_timeout).
  weights: one weight per function of a custom domain (TRL's reward_weights); () = 1 each,
    each finite.
  data_source: what a verl-form compute_score gets as its data_source where the data row
    has no data_source column.
  conversational: a TRL-form function gets prompts and completions as lists of messages.
  preflight: prove the reward before any training (`rlvr.rewards.preflight`): on
    `preflight_rows` training rows, the gold answers score and no answer-free or format-only
    response earns as much; else the run stops in one line.
  preflight_max_bad_gold: the share of sampled gold answers that may fail to score.
  """

  extraction: str = "boxed"
  integer_answers: bool = False
  timeout_s: float = 5.0
  fn_timeout_s: float = 60.0
  domain: str = "math"
  code: CodeRewardConfig = CodeRewardConfig()
  weights: tuple = ()
  data_source: str = ""
  conversational: bool = False
  preflight: bool = True
  preflight_rows: int = 32
  preflight_max_bad_gold: float = 0.1

  def __post_init__(self):
    object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
    bad = [w for w in self.weights if not abs(w) <= _FLOAT32_MAX]
    if bad:
      raise ValueError(
        f"reward.weights: expected finite numbers (a float32 holds them), got {bad[0]!r}"
      )
    if self.domain not in DOMAINS:  # imported and checked now: a bad name stops the start
      custom.score_functions(self.domain, DOMAINS, self.weights)
    elif self.weights:
      raise ValueError(
        f"reward.weights: weigh the functions of a custom reward.domain, not {self.domain!r}"
      )
    if not isinstance(self.code, CodeRewardConfig):
      raise TypeError(f"RewardConfig.code: expected CodeRewardConfig, got {self.code!r}")
    if self.extraction not in EXTRACTIONS:
      raise ValueError(
        f"RewardConfig.extraction: unknown {self.extraction!r}; expected one of {EXTRACTIONS}"
      )
    if not isinstance(self.integer_answers, bool):
      raise TypeError(f"RewardConfig.integer_answers: expected bool, got {self.integer_answers!r}")
    if isinstance(self.preflight_rows, bool) or not (
      isinstance(self.preflight_rows, int) and self.preflight_rows >= 1
    ):
      raise ValueError(f"reward.preflight_rows: expected an int >= 1, got {self.preflight_rows!r}")
    if not 0 <= self.preflight_max_bad_gold <= 1:
      raise ValueError(
        f"reward.preflight_max_bad_gold: expected a share in [0, 1], got "
        f"{self.preflight_max_bad_gold!r}"
      )
    for name in ("timeout_s", "fn_timeout_s"):
      value = getattr(self, name)
      if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or not math.isfinite(value)
      ):
        raise ValueError(
          f"RewardConfig.{name}: expected a positive finite number of seconds, got {value!r}"
        )


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Per-response scores of one `score` call.

  rewards = correct as 1.0 / 0.0 (shaping terms such as QbQ's format bonus are
  added by `rlvr.rewards.shaping`); an item that timed out or crashed its worker scores 0
  (correct and well_formed False).
  timeouts / errors count those items.
  """

  rewards: np.ndarray
  correct: np.ndarray
  well_formed: np.ndarray
  extracted: list
  timeouts: int
  errors: int
