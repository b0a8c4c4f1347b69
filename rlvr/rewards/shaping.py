"""Reward shaping composed onto the verifier's correctness (pure numpy).

  reward = correct + format_bonus * well_formed + overlong_penalty(length)

- format bonus (QbQ): `format_bonus` (0.1 in QbQ) when the response states a
  well-formed final answer (a boxed integer under integer answers);
- soft overlong punishment (DAPO, Eq. 13): with L_max = `overlong_max` and
  L_cache = `overlong_cache`, a response of |y| tokens gets 0 up to
  L_max - L_cache, then (L_max - L_cache - |y|) / L_cache down to -1 at L_max,
  and -1 beyond;
- truncation masking (QbQ, DAPO's overlong filtering) is not a reward: it drops
  length-truncated completions from the loss (`LearnerConfig.mask_truncated`,
  with `normalize_all` for QbQ's all-m normaliser).

Each term is off at its default and logged per step as the mean over the
step's sampled responses (`shaping_format`, `shaping_overlong`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
  format_bonus: float = 0.0  # added when a well-formed final answer is present (QbQ: 0.1)
  overlong_cache: int = 0  # DAPO's L_cache (0 = no overlong punishment; DAPO: 4096)
  overlong_max: int = 0  # DAPO's L_max; 0 = the run's max response length

  def __post_init__(self):
    if not np.isfinite(self.format_bonus):
      raise ValueError(f"format_bonus: expected a finite number, got {self.format_bonus!r}")
    if self.overlong_cache < 0 or self.overlong_max < 0:
      raise ValueError(
        f"overlong_cache / overlong_max: must be >= 0, got "
        f"{self.overlong_cache} / {self.overlong_max}"
      )
    if self.overlong_max and self.overlong_cache > self.overlong_max:
      raise ValueError(
        f"overlong_cache: {self.overlong_cache} exceeds overlong_max {self.overlong_max}"
      )

  @property
  def active(self) -> bool:
    return bool(self.format_bonus) or self.overlong_cache > 0


def overlong_penalty(lengths: Sequence[int], max_len: int, cache_len: int) -> np.ndarray:
  """DAPO's soft overlong punishment per response length (0 when cache_len is 0)."""
  n = np.asarray(lengths, np.float32)
  if cache_len <= 0:
    return np.zeros_like(n)
  start = max_len - cache_len
  return np.where(n <= start, 0.0, np.where(n <= max_len, (start - n) / cache_len, -1.0)).astype(
    np.float32
  )


def format_bonus(well_formed: Sequence[bool], bonus: float) -> np.ndarray:
  """QbQ's bonus: `bonus` for each response with a well-formed final answer."""
  return np.float32(bonus) * np.asarray(well_formed, np.float32)


def shape(
  correct_rewards: Sequence[float],
  lengths: Sequence[int],
  well_formed: Sequence[bool],
  cfg: ShapingConfig,
  max_response_len: int,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """Shaped rewards and the per-response terms that were added."""
  terms = {
    "shaping_format": format_bonus(well_formed, cfg.format_bonus),
    "shaping_overlong": overlong_penalty(
      lengths, cfg.overlong_max or max_response_len, cfg.overlong_cache
    ),
  }
  return np.asarray(correct_rewards, np.float32) + sum(terms.values()), terms
