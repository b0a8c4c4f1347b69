"""Per-token terms beside the policy loss: the KL penalty (k1 / k3), entropy, the truncated
importance weight for sampler / learner mismatch, and chunked token log-probs and entropy
from the decoder's hidden states.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlvr.objectives.aggregation import masked_sum, sequence_mean, to_tokens

TIS_LEVELS = ("token", "sequence")


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


def truncated_is_weight(
  old_logp_bt,
  sampler_logp_bt,
  mask_bt,
  cap: float | None = 2.0,
  level: str = "token",
  mask_cap: float | None = None,
  sequences_bt: jax.Array | None = None,
):
  r"""Importance weight for sampler / learner mismatch (truncated IS, sequence masking).

  token:     w_t = min(rho_t, C),  rho_t = exp(old_logp_t - sampler_logp_t)
  sequence:  w_i = min(rho_i, C),  rho_i = exp(mean_t (old_logp_t - sampler_logp_t)),
             the geometric mean of the sequence's token ratios, on each of its tokens
  cap None: no truncated weight (w = 1), only the mask.
  mask_cap M: w = 0 on every token of a sequence whose rho_i leaves [1/M, M]
             (|mean_t log ratio| > log M): the sequence is dropped from the loss, its
             tokens still counted by the normaliser (as TRL's sequence mask).
  Returns (w_bt without gradient, metrics): over masked tokens mean |old - sampler|,
  k3 KL(sampler || learner), the share of tokens whose weight was capped; with
  mask_cap also seq_masked_frac, the share of this call's non-empty sequences dropped.
  """
  if level not in TIS_LEVELS:
    raise ValueError(f"tis_level: unknown {level!r}; expected one of {TIS_LEVELS}")
  diff = old_logp_bt.astype(jnp.float32) - sampler_logp_bt.astype(jnp.float32)
  seq_log, lengths = sequence_mean(diff, mask_bt, sequences_bt)
  seq_log_bt = to_tokens(seq_log, diff.shape, sequences_bt)
  raw = jnp.exp(diff if level == "token" else seq_log_bt)
  w = jnp.ones_like(raw) if cap is None else jnp.minimum(raw, cap)
  mask = mask_bt.astype(bool)
  n = jnp.maximum(jnp.sum(mask), 1)
  capped = jnp.zeros_like(raw, bool) if cap is None else raw > cap
  metrics = {
    "mismatch_abs": masked_sum(jnp.abs(diff), mask) / n,
    "mismatch_kl": masked_sum(k3(diff), mask) / n,
    "is_capped_frac": masked_sum(capped.astype(jnp.float32), mask) / n,
  }
  if mask_cap is not None:
    bound = float(np.log(mask_cap))
    w = jnp.where(jnp.abs(seq_log_bt) <= bound, w, 0.0)
    real = lengths > 0
    dropped = jnp.sum(real & (jnp.abs(seq_log) > bound))
    metrics["seq_masked_frac"] = dropped / jnp.maximum(jnp.sum(real), 1)
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
  b = hidden_btd.shape[0]
  logp, ent = next_token_logprobs(hidden_btd[:, :-1], head_dv, tokens_bt[:, 1:], chunk, matmul)
  zero = jnp.zeros((b, 1), jnp.float32)
  return jnp.concatenate([zero, logp], 1), jnp.concatenate([zero, ent], 1)


def positions_logprobs_and_entropy(
  hidden_btd: jax.Array,
  head_dv: jax.Array,
  tokens_bt: jax.Array,
  positions_bk: jax.Array,
  chunk: int = 256,
  matmul=None,
) -> tuple[jax.Array, jax.Array]:
  """`token_logprobs_and_entropy` at the target positions `positions_bk` only ([B, K], each
  >= 1; 0 marks an unused slot), the LM head applied to K positions per row instead of T;
  [B, T] results, 0 wherever no position asked."""
  t = hidden_btd.shape[1]
  pos = positions_bk.astype(jnp.int32)
  # per row (vmap): gathers and scatters batched over B stay on each device's own rows
  h = jax.vmap(lambda x, p: x[p])(hidden_btd, jnp.maximum(pos - 1, 0))
  logp, ent = next_token_logprobs(
    h, head_dv, jax.vmap(lambda x, p: x[p])(tokens_bt, pos), chunk, matmul
  )
  put = jax.vmap(lambda p, x: jnp.zeros((t,), jnp.float32).at[p].add(jnp.where(p > 0, x, 0.0)))
  return put(pos, logp), put(pos, ent)


def next_token_logprobs(
  h_bnd: jax.Array, head_dv: jax.Array, targets_bn: jax.Array, chunk: int = 256, matmul=None
) -> tuple[jax.Array, jax.Array]:
  """(log p(targets[n] | h[n]), entropy at h[n]), [B, N] each: the LM head over blocks of
  `chunk` positions, each block recomputed in the backward pass."""
  if matmul is None:
    matmul = lambda x, w: jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
  b, n, d = h_bnd.shape
  chunk = max(1, min(chunk, n))
  pad = (-n) % chunk
  h = jnp.pad(h_bnd, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets_bn, ((0, 0), (0, pad)))
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
  return logp.swapaxes(0, 1).reshape(b, -1)[:, :n], ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
