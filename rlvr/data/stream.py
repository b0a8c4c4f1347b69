"""A resumable shuffle: which example comes next, from three saved integers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class DataStream:
  """Endless shuffled indices into n examples, resumable from a saved position.

  Epoch e is the permutation drawn by default_rng((seed, e)); `position`
  counts indices drawn so far, so (n, seed, position) fully determines what
  comes next and a checkpoint only stores three integers. The epoch enters the
  seed as a separate word (not seed + epoch) so that seed s + 1 does not replay
  seed s's epochs shifted by one.
  """

  def __init__(self, n: int, seed: int, position: int = 0):
    if n < 1:
      raise ValueError(f"DataStream: n must be >= 1, got {n}")
    if seed < 0 or position < 0:
      raise ValueError(f"DataStream: seed and position must be >= 0, got {seed}, {position}")
    self._n, self._seed, self._position = int(n), int(seed), int(position)
    self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

  @property
  def position(self) -> int:
    return self._position

  def epoch_permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng((self._seed, epoch)).permutation(self._n)

  def next_indices(self, k: int) -> list[int]:
    if k < 0:
      raise ValueError(f"next_indices: k must be >= 0, got {k}")
    out: list[int] = []
    while len(out) < k:
      epoch, offset = divmod(self._position, self._n)
      if epoch != self._epoch:
        self._epoch, self._perm = epoch, self.epoch_permutation(epoch)
      take = self._perm[offset : offset + k - len(out)]
      out.extend(int(i) for i in take)
      self._position += len(take)
    return out

  def state(self) -> dict[str, int]:
    return {"n": self._n, "seed": self._seed, "position": self._position}

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> DataStream:
    missing = {"n", "seed", "position"} - set(state)
    if missing:
      raise ValueError(f"DataStream.from_state: missing keys {sorted(missing)} in {dict(state)}")
    return cls(int(state["n"]), int(state["seed"]), int(state["position"]))
