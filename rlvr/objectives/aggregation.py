"""Masked sums and the reduction of per-token loss terms to a scalar (`aggregate`).

Rows may be packed with several sequences (`sequences_bt`: the sequence id of each token
within its row); per-sequence values are laid out as `_per_sequence` says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def masked_sum(x, mask, axis=None):
  return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def by_token(x: jax.Array) -> jax.Array:
  """A per-row value [B] as [B, 1] (broadcasting over tokens); per-token [B, T] as is."""
  return x if x.ndim == 2 else x[:, None]


def _per_sequence(x_bt: jax.Array, sequences_bt: jax.Array | None) -> jax.Array:
  """Sums of x over each sequence: [B] per row, or with packed rows (`sequences_bt`, the
  sequence id of each token within its row) [B * T] per (row, id), most of them empty."""
  if sequences_bt is None:
    return jnp.sum(x_bt, axis=-1)
  b, t = x_bt.shape
  ids = _sequence_ids(x_bt.shape, sequences_bt)
  return jax.ops.segment_sum(x_bt.ravel(), ids.ravel(), num_segments=b * t)


def _sequence_ids(shape: tuple[int, int], sequences_bt: jax.Array) -> jax.Array:
  """The (row, sequence id) pair of each token of packed rows as one index into [B * T]."""
  return jnp.arange(shape[0])[:, None] * shape[1] + sequences_bt


def sequence_mean(
  x_bt: jax.Array, mask_bt: jax.Array, sequences_bt: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """(masked mean of x over each sequence, its token count), one entry per sequence as
  `_per_sequence` lays them out; an empty sequence has mean 0."""
  mask = mask_bt.astype(bool)
  sums = _per_sequence(jnp.where(mask, x_bt, 0.0), sequences_bt)
  lengths = _per_sequence(mask.astype(jnp.float32), sequences_bt)
  return sums / jnp.maximum(lengths, 1.0), lengths


def to_tokens(per_seq: jax.Array, shape: tuple[int, int], sequences_bt: jax.Array | None = None):
  """Per-sequence values (`sequence_mean`'s layout) on every token of their sequence, [B, T]."""
  if sequences_bt is None:
    return jnp.broadcast_to(per_seq[:, None], shape)
  return per_seq[_sequence_ids(shape, sequences_bt)]


def aggregate(
  per_token_bt: jax.Array,
  mask_bt: jax.Array,
  aggregation: str,
  normalizer: jax.Array | float | None = None,
  sequences_bt: jax.Array | None = None,
) -> jax.Array:
  r"""Reduces per-token terms to a scalar loss.

  token-mean:           sum_{b,t} l_bt m_bt / N_tok          (DAPO)
  seq-mean-token-mean:  sum_b [sum_t l_bt m_bt / sum_t m_bt] / N_seq   (GRPO)
  seq-mean-token-sum:   sum_b  sum_t l_bt m_bt / N_seq                 (Dr.GRPO)

  N_tok / N_seq default to this call's token / non-empty-sequence counts;
  pass `normalizer` (the WHOLE batch's count) when this call sees one
  micro-batch, so the summed micro-batch losses equal the full-batch loss.
  Packed rows hold several sequences: pass their ids (`sequences_bt`) and a
  sequence is a (row, id) pair instead of a row.
  """
  mask = mask_bt.astype(bool)
  if aggregation == "token-mean":
    total = masked_sum(per_token_bt, mask)
    n = jnp.sum(mask) if normalizer is None else normalizer
  elif aggregation in ("seq-mean-token-mean", "seq-mean-token-sum"):
    per_seq = _per_sequence(jnp.where(mask, per_token_bt, 0.0), sequences_bt)
    lengths = _per_sequence(mask.astype(jnp.float32), sequences_bt)
    if aggregation == "seq-mean-token-mean":
      per_seq = per_seq / jnp.maximum(lengths, 1)
    total = jnp.sum(per_seq)
    n = jnp.sum(lengths > 0) if normalizer is None else normalizer
  else:
    raise ValueError(f"aggregation: unknown {aggregation!r}; expected one of {AGGREGATIONS}")
  return total / jnp.maximum(n, 1)


def loss_normalizer(
  mask_bt: jax.Array, aggregation: str, sequences_bt: jax.Array | None = None
) -> jax.Array:
  """The N of `aggregate` for a whole batch: token count or non-empty sequence count."""
  mask = mask_bt.astype(bool)
  if aggregation == "token-mean":
    return jnp.sum(mask).astype(jnp.float32)
  return jnp.sum(_per_sequence(mask.astype(jnp.float32), sequences_bt) > 0).astype(jnp.float32)
