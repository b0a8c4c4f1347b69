"""Blockwise attention equals the dense reference (forward and gradients, f32) with
padding, packed segments and grouped-query heads, and the decoder runs it end to end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr import model
from rlvr.model import attention


def _inputs(t=40, h=4, kvh=2, hd=8, seed=0):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(2, t, h, hd), jnp.float32)
  k = jnp.asarray(rng.randn(2, t, kvh, hd), jnp.float32)
  v = jnp.asarray(rng.randn(2, t, kvh, hd), jnp.float32)
  seg = np.ones((2, t), np.int32)
  seg[0, t - 7 :] = 0  # right padding
  seg[1, : t // 3] = 1  # three packed sequences, then padding
  seg[1, t // 3 : 2 * t // 3] = 2
  seg[1, 2 * t // 3 :] = 3
  seg[1, t - 3 :] = 0
  return q, k, v, jnp.asarray(seg)


def _dense(q, k, v, seg):
  t = q.shape[1]
  return attention.dense_attention(q, k, v, seg, seg, jnp.arange(t), jnp.arange(t))


@pytest.mark.parametrize("block_q, block_k", [(8, 8), (16, 8), (8, 16), (64, 64), (7, 5)])
def test_blockwise_matches_dense_forward_and_gradients(block_q, block_k):
  q, k, v, seg = _inputs()
  real = np.asarray(seg) != 0
  got = attention.blockwise_attention(q, k, v, seg, block_q, block_k)
  want = _dense(q, k, v, seg)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)

  w = jnp.asarray(np.random.RandomState(1).randn(*want.shape), jnp.float32) * seg[..., None]

  def loss(fn, q, k, v):  # real rows only, as every loss in the library
    return jnp.sum(fn(q, k, v) * w)

  g_block = jax.grad(
    lambda *a: loss(
      lambda q, k, v: attention.blockwise_attention(q, k, v, seg, block_q, block_k), *a
    ),
    argnums=(0, 1, 2),
  )(q, k, v)
  g_dense = jax.grad(lambda *a: loss(lambda q, k, v: _dense(q, k, v, seg), *a), argnums=(0, 1, 2))(
    q, k, v
  )
  for a, b in zip(g_block, g_dense):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("block", [8, 13, 40])
def test_causal_blocks_match_dense_forward_and_gradients(block):
  """Dense attention per query block over the keys up to it (the decoder's dense form):
  the reference's values and gradients, ragged last block included."""
  q, k, v, seg = _inputs()
  w = jnp.asarray(np.random.RandomState(2).randn(2, 40, 32), jnp.float32) * seg[..., None]
  loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * w)
  blocks = lambda q, k, v: attention.causal_dense_attention(q, k, v, seg, block)
  (l1, g1), (l0, g0) = (
    jax.value_and_grad(loss(f), argnums=(0, 1, 2))(q, k, v)
    for f in (blocks, lambda q, k, v: _dense(q, k, v, seg))
  )
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(
    np.asarray(blocks(q, k, v))[real], np.asarray(_dense(q, k, v, seg))[real], atol=1e-5
  )
  assert abs(float(l1) - float(l0)) < 1e-4
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_fused_attention_matches_dense_on_right_padded_rows():
  """jax.nn.dot_product_attention's masks (causal + per-row length) are ours for the
  learner's rows; checked through its XLA lowering (cuDNN's is the same call on GPU)."""
  q, k, v, _ = _inputs(t=24)
  seg = np.ones((2, 24), np.int32)
  seg[0, 17:] = 0
  seg = jnp.asarray(seg)
  real = np.asarray(seg) != 0
  got = attention.fused_attention(q, k, v, seg, "xla")
  want = _dense(q, k, v, seg)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
  w = jnp.asarray(np.random.RandomState(2).randn(*want.shape), jnp.float32) * seg[..., None]
  g_fused = jax.grad(
    lambda q, k, v: jnp.sum(attention.fused_attention(q, k, v, seg, "xla") * w), argnums=(0, 1, 2)
  )(q, k, v)
  g_dense = jax.grad(lambda q, k, v: jnp.sum(_dense(q, k, v, seg) * w), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g_fused, g_dense):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def _grad_temp_bytes(fn, t):
  q, k, v, seg = (
    jnp.zeros((1, t, 4, 8)),
    jnp.zeros((1, t, 2, 8)),
    jnp.zeros((1, t, 2, 8)),
    jnp.ones((1, t), jnp.int32),
  )
  loss = lambda q, k, v: jnp.sum(fn(q, k, v, seg) ** 2)
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v)
  return lowered.compile().memory_analysis().temp_size_in_bytes, lowered.as_text()


def test_blockwise_memory_grows_linearly_and_skips_blocks_above_the_diagonal():
  """Read from XLA's memory analysis of the compiled gradient: no [T, T] buffer."""
  block = lambda q, k, v, seg: attention.blockwise_attention(q, k, v, seg, 128, 128)
  b1, hlo = _grad_temp_bytes(block, 1024)
  b2, _ = _grad_temp_bytes(block, 2048)
  d1, dense_hlo = _grad_temp_bytes(_dense, 1024)
  assert "1024x1024" not in hlo and "1024x1024" in dense_hlo
  assert "stablehlo.case" in hlo  # the causal skip is a real branch
  assert b2 < 2.5 * b1  # linear in T (dense: quadratic)
  assert b1 < d1 / 4


def test_decoder_logits_agree_across_implementations(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen3"])  # GQA: 4 query heads, 1 KV head
  tokens = jnp.asarray(np.random.RandomState(0).randint(3, cfg.vocab_size, (2, 24)), jnp.int32)
  seg = np.ones((2, 24), np.int32)
  seg[0, 20:] = 0
  seg[1, 12:] = 2
  seg = jnp.asarray(seg)
  out = {
    impl: np.asarray(
      model.forward(params, tokens, config=cfg, segment_ids=seg, attention_impl=impl)
    )
    for impl in ("dense", "blockwise")
  }
  real = np.asarray(seg) != 0
  np.testing.assert_allclose(out["blockwise"][real], out["dense"][real], atol=1e-4)
  assert attention.choose("auto", attention.BLOCKWISE_FROM, decoding=False) == "blockwise"
  assert attention.choose("auto", attention.BLOCKWISE_FROM, decoding=True) == "dense"
  with pytest.raises(ValueError, match="attention: unknown 'flash'"):
    attention.choose("flash", 8, decoding=False)
