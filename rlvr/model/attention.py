"""Causal self-attention over packed, padded rows: a dense reference and a blockwise
implementation that never builds the [T, T] logits.

Shapes: q [B, T, H, hd]; k, v [B, S, KV, hd] with H = KV * g (grouped-query
attention: the g query heads of one KV head are folded into its query axis);
segment ids [B, T] / [B, S] (0 = padding; a query sees keys of its own
segment only, at slots <= its own). Outputs [B, T, H * hd] in q's dtype.

`blockwise_attention` is the online-softmax form (Milakov & Gimelshein 2018;
Rabe & Staats 2021): for each query block, a scan over key blocks keeps the
running max, normaliser and weighted sum, and key blocks wholly above the
causal diagonal are skipped by `lax.cond`. Each query block is rematerialised
in the backward pass, so memory is O(T * block) per layer instead of O(T^2),
on CPU, GPU and TPU alike. Rows that see no key at all (padding queries) give
undefined values there; they are masked out of every loss.

`fused_attention` hands the same computation to `jax.nn.dot_product_attention`
(cuDNN's flash attention on GPU with `implementation="cudnn"`; XLA's own
lowering with "xla", which is how CPU tests check its masking). Its masks cover
the learner's rows exactly as `packing.pack_rows` lays them out (one sequence per
row, then right padding): causal, plus a per-row length. Packed rows (several
segments in one row) are outside what it can express; use blockwise there.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_NEG_INF = -1e30  # finite, so fully-masked (padding) rows stay NaN-free
IMPLEMENTATIONS = ("auto", "dense", "blockwise", "cudnn")
# "auto" switches to blockwise attention from this many positions on (no KV cache).
BLOCKWISE_FROM = 2048


def _fold(q, kvh):
  """[B, T, H, hd] -> [B, KV, g*T, hd] (query heads of one KV head side by side)."""
  b, t, h, hd = q.shape
  g = h // kvh
  return q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, hd)


def _unfold(out, t):
  """[B, KV, g*T, hd] -> [B, T, H*hd]."""
  b, kvh, gt, hd = out.shape
  g = gt // t
  return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g * hd)


def dense_attention(q, k, v, q_segment, kv_segment, q_slot, k_slot):
  """The reference: full [B, KV, g*T, S] logits, one softmax. Also serves decoding, where
  k / v are the KV cache and q_slot / k_slot the cache positions."""
  b, t, h, hd = q.shape
  kvh, s = k.shape[2], k.shape[1]
  dt = q.dtype
  mask_bts = (
    (q_segment[:, :, None] == kv_segment[:, None, :])
    & (kv_segment[:, None, :] != 0)
    & (k_slot[None, None, :] <= q_slot[None, :, None])
  )
  qg = _fold(q, kvh)
  kk = k.astype(dt).transpose(0, 2, 1, 3)
  vv = v.astype(dt).transpose(0, 2, 1, 3)
  logits = jnp.einsum("bkqh,bksh->bkqs", qg, kk, preferred_element_type=jnp.float32) / math.sqrt(hd)
  g = h // kvh
  logits = jnp.where(mask_bts[:, None, None], logits.reshape(b, kvh, g, t, s), _NEG_INF)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt).reshape(b, kvh, g * t, s)
  return _unfold(jnp.einsum("bkqs,bksh->bkqh", probs, vv), t)


def causal_dense_attention(q, k, v, segment, block: int = 256):
  """Training self-attention (k, v at q's positions) as `dense_attention` per block of
  `block` queries over the keys up to that block's end: the same values, without the
  key blocks wholly above the causal diagonal (about half of all logits at long T;
  T = 2,048 on CPU: step 10.6 s -> 7.0 s in f32). Memory stays O(T^2 / 2): the long-T
  form is `blockwise_attention`."""
  t = q.shape[1]
  slots = jnp.arange(t)
  outs = [
    dense_attention(
      q[:, lo : lo + block],
      k[:, : lo + block],
      v[:, : lo + block],
      segment[:, lo : lo + block],
      segment[:, : lo + block],
      slots[lo : lo + block],
      slots[: lo + block],
    )
    for lo in range(0, t, block)
  ]
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def _pad_to(x, axis, multiple):
  pad = (-x.shape[axis]) % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def blockwise_attention(q, k, v, segment, block_q: int = 512, block_k: int = 512):
  """Causal self-attention (k, v at the same positions as q) without [T, T] memory."""
  b, t, h, hd = q.shape
  kvh = k.shape[2]
  g = h // kvh
  dt = q.dtype
  block_q, block_k = min(block_q, t), min(block_k, t)
  scale = 1.0 / math.sqrt(hd)
  # Pad T to whole blocks; padded positions get segment 0 (never attended to).
  qp = _pad_to(q, 1, block_q)
  seg_q = _pad_to(segment, 1, block_q)
  kp, vp = _pad_to(k, 1, block_k), _pad_to(v, 1, block_k)
  seg_k = _pad_to(segment, 1, block_k)
  nq, nk = qp.shape[1] // block_q, kp.shape[1] // block_k
  # [nq, B, KV, g, bq, hd] query blocks; [nk, B, KV, bk, hd] key/value blocks
  q_blocks = qp.reshape(b, nq, block_q, kvh, g, hd).transpose(1, 0, 3, 4, 2, 5)
  k_blocks = kp.astype(dt).reshape(b, nk, block_k, kvh, hd).transpose(1, 0, 3, 2, 4)
  v_blocks = vp.astype(dt).reshape(b, nk, block_k, kvh, hd).transpose(1, 0, 3, 2, 4)
  sq_blocks = seg_q.reshape(b, nq, block_q).transpose(1, 0, 2)
  sk_blocks = seg_k.reshape(b, nk, block_k).transpose(1, 0, 2)

  @jax.checkpoint
  def one_query_block(args):
    qi, qb, sq = args  # qb [B, KV, g, bq, hd], sq [B, bq]
    q_pos = qi * block_q + jnp.arange(block_q)

    def step(carry, kj):
      m, l, acc = carry  # [B, KV, g, bq], [B, KV, g, bq], [B, KV, g, bq, hd]

      def visit(carry):
        m, l, acc = carry
        kb, vb, sk = k_blocks[kj], v_blocks[kj], sk_blocks[kj]
        k_pos = kj * block_k + jnp.arange(block_k)
        logits = jnp.einsum("bkgqh,bksh->bkgqs", qb, kb, preferred_element_type=jnp.float32) * scale
        mask = (
          (sq[:, :, None] == sk[:, None, :])
          & (sk[:, None, :] != 0)
          & (k_pos[None, None, :] <= q_pos[None, :, None])
        )  # [B, bq, bk]
        logits = jnp.where(mask[:, None, None], logits, _NEG_INF)
        m_new = jnp.maximum(m, logits.max(-1))
        p = jnp.exp(logits - m_new[..., None])
        correction = jnp.exp(m - m_new)
        l = l * correction + p.sum(-1)
        acc = acc * correction[..., None] + jnp.einsum(
          "bkgqs,bksh->bkgqh", p.astype(dt), vb, preferred_element_type=jnp.float32
        )
        return m_new, l, acc

      # Key blocks that start after this query block's last position are all masked.
      below = kj * block_k <= qi * block_q + block_q - 1
      return jax.lax.cond(below, visit, lambda c: c, carry), None

    init = (
      jnp.full(qb.shape[:-1], _NEG_INF, jnp.float32),
      jnp.zeros(qb.shape[:-1], jnp.float32),
      jnp.zeros(qb.shape, jnp.float32),
    )
    (m, l, acc), _ = jax.lax.scan(step, init, jnp.arange(nk))
    return (acc / jnp.maximum(l, 1e-30)[..., None]).astype(dt)

  out = jax.lax.map(one_query_block, (jnp.arange(nq), q_blocks, sq_blocks))
  # [nq, B, KV, g, bq, hd] -> [B, T, H*hd]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * block_q, h * hd)
  return out[:, :t]


def fused_attention(q, k, v, segment, implementation: str = "cudnn"):
  """Causal self-attention through `jax.nn.dot_product_attention`, for right-padded
  rows holding one sequence each (segment ids 1...1 0...0), grouped-query heads native.

  implementation: "cudnn" (GPU, bf16 / f16: cuDNN flash attention, no [T, T] memory,
  blocks above the diagonal skipped) or "xla" (any platform; builds the logits).
  """
  b, t, h, hd = q.shape
  lengths = jnp.sum(segment != 0, axis=-1).astype(jnp.int32)
  out = jax.nn.dot_product_attention(
    q,
    k.astype(q.dtype),
    v.astype(q.dtype),
    is_causal=True,
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation=implementation,
  )
  return out.reshape(b, t, h * hd)


def choose(implementation: str, t: int, decoding: bool) -> str:
  """The implementation to run: `auto` is blockwise from BLOCKWISE_FROM positions on,
  dense below (and always when decoding with a KV cache). "cudnn" is only ever
  chosen explicitly (GPU, right-padded unpacked rows: `fused_attention`)."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"attention: unknown {implementation!r}; expected one of {IMPLEMENTATIONS}")
  if decoding or implementation == "dense":
    return "dense"
  if implementation == "blockwise" or t >= BLOCKWISE_FROM:
    return "blockwise"
  return "dense"
