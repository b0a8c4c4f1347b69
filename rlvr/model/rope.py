"""Rotary position embeddings (RoPE) of the decoder: inverse frequencies, with the Llama-3.1
rescaling when configured, and the rotation of queries and keys (HF "rotate_half" layout)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlvr.model.config import ModelConfig, RopeScaling


def rope_frequencies(config: ModelConfig) -> jax.Array:
  """Inverse frequencies theta^(-2i/d), rescaled per Llama-3 when configured."""
  d = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  if config.rope_scaling is not None:
    inv_freq = _llama3_scale(inv_freq, config.rope_scaling)
  return inv_freq


def _llama3_scale(inv_freq: jax.Array, s: RopeScaling) -> jax.Array:
  """Llama-3.1: long wavelengths divided by `factor`, short kept, smooth between."""
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
    s.high_freq_factor - s.low_freq_factor
  )
  smoothed = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
  out = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(middle, smoothed, out)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates halves (HF "rotate_half" layout), computed in f32."""
  angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B,T,D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x = x_bthd.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bthd.dtype)
