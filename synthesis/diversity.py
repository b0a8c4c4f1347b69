"""Vendi score of a problem pool (docs/methods.md#diversity), pure numpy.

VS_q = Hill number of order q of the eigenvalues lambda of K / n, K the cosine
similarity matrix of the n embeddings: q = 1 gives exp(-sum lambda log lambda) (the
paper's score), q = inf gives 1 / max lambda, any other q >= 0 gives
(sum lambda^q)^(1 / (1 - q)). It reads as the effective number of distinct items:
1 for n copies of one item, n for n mutually orthogonal items.

Choices of ours: the nonzero eigenvalues of X X^T / n and X^T X / n coincide, so
the smaller of the two matrices is decomposed (a pool of thousands of problems with
embeddings of a few thousand dimensions stays cheap); eigenvalues below 1e-12 are
round-off and count as 0 (it matters only for q = 0, the rank); a zero or non-finite
embedding row has no direction and is an error, not a silent zero.

`hashed_ngrams` is a model-free stand-in embedding (character n-gram counts hashed
into a fixed width) for runs with no embedding model; the paper embeds with
Qwen3-Embedding-8B, so its scores are not comparable to the paper's numbers.
"""

from __future__ import annotations

import math
import zlib
from typing import Callable, Sequence

import numpy as np

_EPS = 1e-12


def _unit_rows(embeddings) -> np.ndarray:
  x = np.asarray(embeddings, dtype=np.float64)
  if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
    raise ValueError(f"embeddings: expected a non-empty 2-D array, got shape {x.shape}")
  bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
  if bad.size:
    raise ValueError(f"embeddings: row {int(bad[0])} is not finite")
  norms = np.linalg.norm(x, axis=1)
  zero = np.flatnonzero(norms == 0)
  if zero.size:
    raise ValueError(
      f"embeddings: row {int(zero[0])} is all zeros (no direction for a cosine similarity)"
    )
  return x / norms[:, None]


def similarity_eigenvalues(embeddings) -> np.ndarray:
  """Eigenvalues of K / n (descending, clipped at 0, summing to 1) for K = cosine matrix."""
  x = _unit_rows(embeddings)
  n, dim = x.shape
  gram = x @ x.T if n <= dim else x.T @ x
  lam = np.clip(np.linalg.eigvalsh(gram / n), 0.0, None)
  lam[lam < _EPS] = 0.0
  return np.sort(lam / lam.sum())[::-1]  # trace(K / n) = 1 up to round-off


def vendi_score(embeddings, q: float = 1.0) -> float:
  """Vendi score of order q (q = 1: the paper's; q = inf: 1 / max eigenvalue)."""
  if not q >= 0:
    raise ValueError(f"q: expected q >= 0, got {q}")
  lam = similarity_eigenvalues(embeddings)
  lam = lam[lam > 0]
  if math.isinf(q):
    return float(1.0 / lam.max())
  if q == 1:
    return float(np.exp(-np.sum(lam * np.log(lam))))
  return float(np.exp(np.log(np.sum(lam**q)) / (1.0 - q)))


def pool_vendi(
  texts: Sequence[str], embed: Callable[[list[str]], np.ndarray], q: float = 1.0
) -> float:
  """Vendi score of a pool of texts under `embed(texts) -> (len(texts), dim)` embeddings;
  an error names the row, which is the index of the text."""
  texts = list(texts)
  x = np.asarray(embed(texts))
  if x.ndim != 2 or x.shape[0] != len(texts):
    raise ValueError(f"embed: expected {len(texts)} rows, got shape {x.shape}")
  return vendi_score(x, q)


def hashed_ngrams(texts: Sequence[str], dim: int = 4096, n: int = 3) -> np.ndarray:
  """(len(texts), dim) counts of the character n-grams of each case-folded,
  whitespace-collapsed text, hashed with crc32 (the same in every process, unlike
  `hash`). A text shorter than n is padded with spaces, so only an empty or blank
  text gives a zero row."""
  if dim < 1 or n < 1:
    raise ValueError(f"hashed_ngrams: expected dim >= 1 and n >= 1, got {dim}, {n}")
  out = np.zeros((len(texts), dim), dtype=np.float64)
  for i, text in enumerate(texts):
    t = " ".join(text.split()).casefold()
    if t:
      t = t.ljust(n)
      for j in range(len(t) - n + 1):
        out[i, zlib.crc32(t[j : j + n].encode("utf-8")) % dim] += 1.0
  return out
