"""GRPO maths as pure jnp functions: advantages, clipped surrogate, KL, entropy.

Shapes: g groups of n responses, b = g*n sequences, t tokens. `*_bt` arrays
are aligned to target tokens: entry [b, t] belongs to token t of row b, its
log-probability taken from the logits at t-1; `mask_bt` is 1 where the token
is a completion token that counts in the loss.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def group_advantages(
  rewards_gn: jax.Array, normalize_std: bool = True, eps: float = 1e-6, ddof: int = 1
) -> jax.Array:
  r"""Group-relative advantages.

  A_i = (r_i - mean_j r_j) / (std_j r_j + eps)   (GRPO)
  A_i =  r_i - mean_j r_j                        (Dr.GRPO, normalize_std=False)

  std is the unbiased group std (ddof 1) by default, as verl and TRL compute it
  (`torch.std`); ddof=0 gives the population std. A group whose rewards are all
  equal gets exactly 0 (not fp noise), so it contributes nothing to the loss.
  """
  r = rewards_gn.astype(jnp.float32)
  centered = r - jnp.mean(r, axis=-1, keepdims=True)
  constant = jnp.all(r == r[..., :1], axis=-1, keepdims=True)
  if normalize_std:
    adv = centered / (jnp.std(r, axis=-1, keepdims=True, ddof=ddof) + eps)
  else:
    adv = centered
  return jnp.where(constant, 0.0, adv)


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
  ids = jnp.arange(b)[:, None] * t + sequences_bt
  return jax.ops.segment_sum(x_bt.ravel(), ids.ravel(), num_segments=b * t)


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


def clipped_surrogate(
  logp_bt, old_logp_bt, advantages, eps_low: float, eps_high: float, dual_clip: float | None = None
):
  r"""Per-token PPO/GRPO loss with clip-higher and optional dual-clip.

  advantages: one advantage per row [B], or per token [B, T] (packed rows).

  k_t = exp(logp_t - old_logp_t)
  l_t = -min(k_t A, clip(k_t, 1 - eps_low, 1 + eps_high) A)
  dual-clip (A < 0):  l_t = min(l_t, -c A)
  Returns (l_bt, ratio_bt).
  """
  adv = by_token(advantages).astype(jnp.float32)
  ratio = jnp.exp(logp_bt.astype(jnp.float32) - old_logp_bt.astype(jnp.float32))
  loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
  return loss, ratio


def policy_loss(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  dual_clip: float | None = None,
  aggregation: str = "token-mean",
  normalizer=None,
  is_weight_bt: jax.Array | None = None,
  sequences_bt: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, Any]]:
  r"""Clipped surrogate (see `clipped_surrogate`), optionally importance-weighted
  per token (`is_weight_bt`, no gradient), reduced by `aggregate` (`sequences_bt`:
  packed rows' sequence ids).

  aux: clip_frac_low (k < 1-eps_low with A < 0), clip_frac_high (k > 1+eps_high
  with A > 0), dual_clip_frac, ratio_mean / ratio_max / ratio_min, over masked tokens.
  """
  per_token, ratio = clipped_surrogate(logp_bt, old_logp_bt, adv, eps_low, eps_high, dual_clip)
  if is_weight_bt is not None:
    per_token = per_token * jax.lax.stop_gradient(is_weight_bt)
  loss = aggregate(per_token, mask_bt, aggregation, normalizer, sequences_bt)
  mask = mask_bt.astype(bool)
  n = jnp.maximum(jnp.sum(mask), 1)
  a = by_token(adv)
  frac = lambda cond: masked_sum(cond.astype(jnp.float32), mask) / n
  aux = {
    "clip_frac_low": frac((ratio < 1.0 - eps_low) & (a < 0)),
    "clip_frac_high": frac((ratio > 1.0 + eps_high) & (a > 0)),
    "dual_clip_frac": frac((ratio > (jnp.inf if dual_clip is None else dual_clip)) & (a < 0)),
    "ratio_mean": masked_sum(ratio, mask) / n,
    "ratio_max": jnp.max(jnp.where(mask, ratio, -jnp.inf)),
    "ratio_min": jnp.min(jnp.where(mask, ratio, jnp.inf)),
  }
  return loss, aux


def k3(log_ratio_bt: jax.Array) -> jax.Array:
  r"""k3 estimate of KL(p || q) per sample of p, from d = log q - log p:
  exp(d) - d - 1 (>= 0, unbiased, low variance)."""
  return jnp.exp(log_ratio_bt) - log_ratio_bt - 1.0


def kl_penalty(logp_bt, ref_logp_bt, estimator: str = "k3") -> jax.Array:
  r"""Per-token KL(pi || pi_ref) estimate from samples of pi.

  k1 = logp - ref_logp;  k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1  (>= 0)
  """
  d = ref_logp_bt.astype(jnp.float32) - logp_bt.astype(jnp.float32)
  if estimator == "k1":
    return -d
  if estimator == "k3":
    return k3(d)
  raise ValueError(f"kl estimator: unknown {estimator!r}; expected 'k1' or 'k3'")


def entropy_from_logits(logits_btv: jax.Array) -> jax.Array:
  r"""H = logsumexp(z) - sum_v softmax(z)_v z_v, per token, in f32."""
  z = logits_btv.astype(jnp.float32)
  lse = jax.nn.logsumexp(z, axis=-1)
  return lse - jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)


def truncated_is_weight(old_logp_bt, sampler_logp_bt, mask_bt, cap: float = 2.0):
  r"""Truncated importance weight for sampler/learner mismatch.

  w_t = min(exp(old_logp_t - sampler_logp_t), C)
  Returns (w_bt, metrics): mean |old - sampler|, k3 KL(sampler || learner),
  and the fraction of tokens whose weight was capped.
  """
  diff = old_logp_bt.astype(jnp.float32) - sampler_logp_bt.astype(jnp.float32)
  raw = jnp.exp(diff)
  w = jnp.minimum(raw, cap)
  mask = mask_bt.astype(bool)
  n = jnp.maximum(jnp.sum(mask), 1)
  metrics = {
    "mismatch_abs": masked_sum(jnp.abs(diff), mask) / n,
    "mismatch_kl": masked_sum(k3(diff), mask) / n,
    "is_capped_frac": masked_sum((raw > cap).astype(jnp.float32), mask) / n,
  }
  return jax.lax.stop_gradient(w), metrics


def token_logprobs_and_entropy(
  hidden_btd: jax.Array, head_dv: jax.Array, tokens_bt: jax.Array, chunk: int = 256, matmul=None
) -> tuple[jax.Array, jax.Array]:
  r"""log p(tokens[t] | <t) and entropy of the next-token distribution, target-aligned.

  Works on the decoder's final hidden states in chunks of `chunk` positions,
  each chunk rematerialised in the backward pass, so at most one
  [B, chunk, V] logits block exists at a time. Entry [b, 0] is 0 (no context).
  matmul(x [n, D], head [D, V]) -> f32 logits [n, V]; default: in x's dtype with f32
  accumulation (the learner passes `lowp.logits_matmul`, CPU-friendly gradients).
  """
  if matmul is None:
    matmul = lambda x, w: jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
  b, t, d = hidden_btd.shape
  h = hidden_btd[:, :-1]
  targets = tokens_bt[:, 1:]
  n = t - 1
  chunk = max(1, min(chunk, n))
  pad = (-n) % chunk
  h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  nc = (n + pad) // chunk
  h = h.reshape(b, nc, chunk, d).swapaxes(0, 1)
  targets = targets.reshape(b, nc, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one(args):
    hc, tc = args
    z = matmul(hc.reshape(-1, d), head_dv)
    z = z.reshape(hc.shape[:2] + (-1,))
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, tc[..., None], axis=-1)[..., 0] - lse
    ent = lse - jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)
    return logp, ent

  logp, ent = jax.lax.map(one, (h, targets))
  logp = logp.swapaxes(0, 1).reshape(b, -1)[:, :n]
  ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
  zero = jnp.zeros((b, 1), jnp.float32)
  return jnp.concatenate([zero, logp], 1), jnp.concatenate([zero, ent], 1)
