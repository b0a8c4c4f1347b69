"""Policy losses: the clipped surrogate, GRPO / GSPO / GSPO-token / CISPO, and the
`POLICY_LOSSES` registry (`rl.learner.policy_loss`) with `policy_loss`, which weights,
aggregates and reports clip statistics. `policy_loss_fn` also takes
"package.module:function" for a loss defined elsewhere.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from rlvr.common import named
from rlvr.objectives.aggregation import aggregate, by_token, masked_sum, sequence_mean, to_tokens


def _clipped(ratio, adv, eps_low: float, eps_high: float):
  """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), elementwise."""
  return jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))


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
  loss = _clipped(ratio, adv, eps_low, eps_high)
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
  return loss, ratio


# ------------------------------------------------------------ policy losses
# A policy loss: fn(logp_bt, old_logp_bt, advantages, mask_bt, *, eps_low, eps_high,
# dual_clip, sequences_bt) -> (per-token loss [B, T], the ratio it clips [B, T]).
# `policy_loss` weights the terms (mismatch correction), aggregates them and reports
# clip statistics of the ratio. A term may depend on other tokens of its own sequence
# (never on another sequence), so micro-batches of whole rows give the same step.


def grpo_loss(
  logp_bt, old_logp_bt, advantages, mask_bt, *, eps_low, eps_high, dual_clip=None, sequences_bt=None
):
  r"""GRPO / DAPO (`clipped_surrogate`): a token-level ratio k_t, clipped per token.

  l_t = -min(k_t A, clip(k_t, 1 - eps_low, 1 + eps_high) A),  k_t = pi(o_t) / pi_old(o_t),
  with the dual clip min(l_t, -c A) where A < 0.
  """
  return clipped_surrogate(logp_bt, old_logp_bt, advantages, eps_low, eps_high, dual_clip)


def _log_sequence_ratio(logp_bt, old_logp_bt, mask_bt, sequences_bt):
  """log s_i on every token of sequence i: mean over its tokens of log pi - log pi_old."""
  d = logp_bt.astype(jnp.float32) - old_logp_bt.astype(jnp.float32)
  return to_tokens(sequence_mean(d, mask_bt, sequences_bt)[0], d.shape, sequences_bt)


def gspo_loss(
  logp_bt, old_logp_bt, advantages, mask_bt, *, eps_low, eps_high, dual_clip=None, sequences_bt=None
):
  r"""GSPO (Qwen, arXiv 2507.18071): one ratio per sequence.

  s_i = (pi(o_i | q) / pi_old(o_i | q))^(1 / |o_i|) = exp( mean_t log(pi(o_it) / pi_old(o_it)) )
  J   = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

  The sequence's term l_i = -min(...) is placed on each of its tokens, so the
  aggregation decides the weighting: "seq-mean-token-mean" is the paper's 1/G sum_i,
  "token-mean" weights sequences by length. The gradient of l_i flows through the
  mean log-ratio (grad s_i = s_i mean_t grad log pi(o_it)). No dual clip (the paper
  has none; `dual_clip` is ignored). Advantages: per row, or per token with every
  token of a sequence holding its sequence's value (packed rows).
  """
  s = jnp.exp(_log_sequence_ratio(logp_bt, old_logp_bt, mask_bt, sequences_bt))
  return _clipped(s, by_token(advantages).astype(jnp.float32), eps_low, eps_high), s


def gspo_token_loss(
  logp_bt, old_logp_bt, advantages, mask_bt, *, eps_low, eps_high, dual_clip=None, sequences_bt=None
):
  r"""GSPO-token (arXiv 2507.18071): the sequence ratio with a token-level gradient.

  s_it = sg(s_i) * pi(o_it) / sg(pi(o_it))        (value s_i, gradient s_i grad log pi(o_it))
  l_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it)

  With one advantage per sequence and "seq-mean-token-mean" its gradient is GSPO's;
  it also takes per-token advantages (verl's "gspo" is this form). No dual clip.
  """
  logp = logp_bt.astype(jnp.float32)
  log_s = jax.lax.stop_gradient(_log_sequence_ratio(logp, old_logp_bt, mask_bt, sequences_bt))
  s = jnp.exp(log_s + logp - jax.lax.stop_gradient(logp))
  return _clipped(s, by_token(advantages).astype(jnp.float32), eps_low, eps_high), s


def cispo_loss(
  logp_bt, old_logp_bt, advantages, mask_bt, *, eps_low, eps_high, dual_clip=None, sequences_bt=None
):
  r"""CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

  J = sum_it sg(clip(k_it, 1 - eps_low, 1 + eps_high)) A_i log pi(o_it)
  l_t = -sg(clip(k_t, 1 - eps_low, 1 + eps_high)) A_t log pi(o_t),   k_t = pi(o_t) / pi_old(o_t)

  Every token keeps a gradient (sg(clip(k)) A grad log pi), also where k is outside
  the range; the paper normalises per token ("token-mean"). The loss value carries
  log pi, so it is not on GRPO's scale; its gradient is. No dual clip.
  """
  logp = logp_bt.astype(jnp.float32)
  ratio = jnp.exp(logp - old_logp_bt.astype(jnp.float32))
  weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
  return -weight * by_token(advantages).astype(jnp.float32) * logp, ratio


POLICY_LOSSES: dict[str, Callable] = {
  "grpo": grpo_loss,
  "gspo": gspo_loss,
  "gspo_token": gspo_token_loss,
  "cispo": cispo_loss,
}


def policy_loss_fn(name: str) -> Callable:
  """The policy loss `name` selects: a key of POLICY_LOSSES or "package.module:function"."""
  return named.load("policy_loss", name, POLICY_LOSSES, "a loss")


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
  loss: str = "grpo",
) -> tuple[jax.Array, dict[str, Any]]:
  r"""The policy loss `loss` names (`policy_loss_fn`; default GRPO's `clipped_surrogate`),
  optionally importance-weighted per token (`is_weight_bt`, no gradient), reduced by
  `aggregate` (`sequences_bt`: packed rows' sequence ids).

  aux, over masked tokens, of the ratio the loss clips (the sequence ratio for GSPO):
  clip_frac_low (k < 1-eps_low with A < 0), clip_frac_high (k > 1+eps_high with A > 0),
  dual_clip_frac (k > c with A < 0), ratio_mean / ratio_max / ratio_min.
  """
  per_token, ratio = policy_loss_fn(loss)(
    logp_bt,
    old_logp_bt,
    adv,
    mask_bt,
    eps_low=eps_low,
    eps_high=eps_high,
    dual_clip=dual_clip,
    sequences_bt=sequences_bt,
  )
  if is_weight_bt is not None:
    per_token = per_token * jax.lax.stop_gradient(is_weight_bt)
  total = aggregate(per_token, mask_bt, aggregation, normalizer, sequences_bt)
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
  return total, aux
