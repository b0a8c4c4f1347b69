"""Text embeddings from the decoder: mean-pooled final hidden states.

What QbQ's diversity measure needs from "our model" (`synthesis.diversity.pool_vendi`
takes any `embed(texts) -> [n, d]`): each text is tokenized without a chat template,
run through the decoder, and its final normed hidden states are averaged over its
real tokens. Batches are padded to powers of two in rows and length, so a pool of
any size compiles a few shapes.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr.model import decoder
from rlvr.model.config import ModelConfig


def _bucket(n: int, minimum: int) -> int:
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("config",))
def _mean_hidden(params, tokens_bt, segment_bt, *, config: ModelConfig):
  hidden = decoder.forward(
    params, tokens_bt, config=config, segment_ids=segment_bt, return_hidden=True
  ).astype(jnp.float32)
  mask = (segment_bt > 0)[..., None]
  return jnp.sum(jnp.where(mask, hidden, 0.0), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)


def embedder(
  params, config: ModelConfig, tokenizer, *, batch: int = 32, max_len: int = 512
) -> Callable[[Sequence[str]], np.ndarray]:
  """embed(texts) -> [len(texts), hidden] float64; texts longer than max_len tokens keep
  their first max_len tokens."""

  def embed(texts: Sequence[str]) -> np.ndarray:
    out = []
    for i in range(0, len(texts), batch):
      ids = [
        tokenizer.encode(t, add_special_tokens=False)[:max_len] or [0] for t in texts[i : i + batch]
      ]
      rows, length = _bucket(len(ids), 8), _bucket(max(map(len, ids)), 16)
      tokens = np.zeros((rows, length), np.int32)
      seg = np.zeros((rows, length), np.int32)
      for r, x in enumerate(ids):
        tokens[r, : len(x)], seg[r, : len(x)] = x, 1
      pooled = _mean_hidden(params, jnp.asarray(tokens), jnp.asarray(seg), config=config)
      out.append(np.asarray(pooled, np.float64)[: len(ids)])
    return np.concatenate(out) if out else np.zeros((0, config.hidden_size))

  return embed
