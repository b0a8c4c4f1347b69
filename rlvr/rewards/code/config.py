"""Settings and results of the code reward: `CodeRewardConfig`, `Verdict`, `CodeScore`. What
one program may use and the sandbox it runs in are `rlvr.sandbox`'s."""

from __future__ import annotations

import dataclasses

import numpy as np

from rlvr.sandbox.limits import SANDBOXES, CodeLimits, positive

# Why a program scored what it did; every reason but "ok" scores 0 under the binary reward.
REASONS = (
  "ok",
  "wrong_answer",
  "timeout",
  "memory",
  "runtime_error",
  "output_limit",
  "no_code",
  "too_long",
  "sandbox_error",
  "judge_error",
)
CODE_EXTRACTIONS = ("last_block", "whole")


@dataclasses.dataclass(frozen=True)
class CodeRewardConfig:
  """How responses with code become rewards.

  sandbox: "bwrap" (bubblewrap; the default and the only choice for model-written code) or
    "none" (a plain subprocess with the same rlimits: trusted code only, logged as a warning).
  limits: per-program limits (`CodeLimits`).
  workers: programs run at once (each in its own sandbox).
  pass_fraction: reward = fraction of tests passed instead of 1 when all pass, else 0.
  float_tol: 0 compares output tokens as strings; > 0 also accepts numbers within this
    absolute or relative tolerance.
  extraction: "last_block" (the last fenced python block) or "whole" (the whole response).
  max_response_chars: a longer response is not parsed (verdict "too_long").
  """

  sandbox: str = "bwrap"
  limits: CodeLimits = CodeLimits()
  workers: int = 2
  pass_fraction: bool = False
  float_tol: float = 0.0
  extraction: str = "last_block"
  max_response_chars: int = 1 << 20

  def __post_init__(self):
    if self.sandbox not in SANDBOXES:
      raise ValueError(
        f"CodeRewardConfig.sandbox: unknown {self.sandbox!r}; expected one of {SANDBOXES}"
      )
    if not isinstance(self.limits, CodeLimits):
      raise TypeError(f"CodeRewardConfig.limits: expected CodeLimits, got {self.limits!r}")
    positive("CodeRewardConfig", "workers", self.workers, int)
    positive("CodeRewardConfig", "max_response_chars", self.max_response_chars, int)
    if not isinstance(self.pass_fraction, bool):
      raise TypeError(f"CodeRewardConfig.pass_fraction: expected bool, got {self.pass_fraction!r}")
    if (
      isinstance(self.float_tol, bool)
      or not isinstance(self.float_tol, (int, float))
      or not 0 <= self.float_tol < 1
    ):
      raise ValueError(
        f"CodeRewardConfig.float_tol: expected a number in [0, 1), got {self.float_tol!r}"
      )
    if self.extraction not in CODE_EXTRACTIONS:
      raise ValueError(
        f"CodeRewardConfig.extraction: unknown {self.extraction!r}; "
        f"expected one of {CODE_EXTRACTIONS}"
      )


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The outcome of one program on its tests.

  passed / total: test cases passed, of all (cases not run after an early stop count as
  failed). reason: "ok" when all passed, else the first failure's (`REASONS`). detail: a
  short human-readable note on that failure.
  """

  passed: int
  total: int
  reason: str
  detail: str = ""


@dataclasses.dataclass(frozen=True)
class CodeScore:
  """Per-response results of one `score` call.

  rewards: 1.0 / 0.0 (all tests pass), or the pass fraction with `pass_fraction`.
  correct: every test passed. reasons: how many responses ended with each reason.
  """

  rewards: np.ndarray
  correct: np.ndarray
  verdicts: list
  reasons: dict
