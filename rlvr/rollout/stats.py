"""What a batch of graded samples says: unbiased pass@k, a group's solve rates, how much a
response repeats itself."""

from __future__ import annotations

import math

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  r"""Unbiased pass@k (Chen et al. 2021) from n samples of which c are correct.

  pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i); 1 when n-c < k.
  """
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_up_to(n: int) -> list[int]:
  """1, 2, 4, ... <= n."""
  return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def group_stats(correct_gn: np.ndarray) -> dict[str, float]:
  """Accuracy, solve_all and solve_none rates of [groups, n] correctness."""
  acc = correct_gn.mean(axis=1)
  return {
    "accuracy": float(acc.mean()),
    "solve_all": float((acc == 1).mean()),
    "solve_none": float((acc == 0).mean()),
  }


def repeated_3gram_frac(token_ids) -> float:
  """The share of a sequence's token 3-grams that occur earlier in it: 0 for text that never
  repeats three tokens, near 1 for a response stuck in a loop; 0 under 4 tokens. Each 3-gram
  is one int64 (21 bits a token id), so the count is exact for vocabularies under 2**21."""
  ids = np.asarray(token_ids, np.int64)
  if len(ids) < 4:
    return 0.0
  keys = (ids[:-2] << 42) | (ids[1:-1] << 21) | ids[2:]
  return 1.0 - len(np.unique(keys)) / len(keys)
