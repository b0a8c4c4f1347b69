"""Verifiable rewards: answer extraction, math-verify equivalence, a hang-proof pool.

A response earns `correct` (1/0: its final answer matches the reference);
`well_formed` says whether it states a well-formed final answer, on which
`rlvr.rewards.shaping` adds QbQ's format bonus. Extraction (`extraction`) and string normalisation (`equivalence`)
are pure functions that run in the caller; math-verify (sympy) runs in worker
processes because a single pathological answer (`9^{9^{9^{9}}}`, `(10^8)!`)
can hold a CPU for minutes and its own timeouts use `signal.alarm`, which works
only in a process's main thread. `RewardPool` (`pool`) kills and replaces a
worker whose item overruns its time (or that dies), scores that item 0, and
carries on. `RewardConfig` / `ScoreResult` (`config`) are the settings and
the scores.
"""

from rlvr.rewards.config import RewardConfig, ScoreResult
from rlvr.rewards.equivalence import clean_latex, is_equivalent, is_well_formed, normalize_integer
from rlvr.rewards.extraction import (
  EXTRACTIONS,
  after_thinking,
  extract_answer,
  extract_answer_line,
  extract_boxed,
)
from rlvr.rewards.pool import RewardPool, score

__all__ = [
  "EXTRACTIONS",
  "RewardConfig",
  "RewardPool",
  "ScoreResult",
  "after_thinking",
  "clean_latex",
  "extract_answer",
  "extract_answer_line",
  "extract_boxed",
  "is_equivalent",
  "is_well_formed",
  "normalize_integer",
  "score",
]
