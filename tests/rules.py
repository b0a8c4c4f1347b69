"""Reward rules the tests score with (real code paths, a rule instead of math-verify)."""

from __future__ import annotations

import numpy as np


def even_length(texts, golds, prompts=None):
  """Right when the response text has an even length: about half of a random policy's
  responses, so groups come out mixed."""
  del golds, prompts
  r = np.array([float(len(t) % 2 == 0) for t in texts], np.float32)
  return r, r > 0
