"""GRPO maths as pure jnp functions: advantages, policy losses, KL, entropy, mismatch weights.

Shapes: g groups of n responses, b = g*n sequences, t tokens. `*_bt` arrays
are aligned to target tokens: entry [b, t] belongs to token t of row b, its
log-probability taken from the logits at t-1; `mask_bt` is 1 where the token
is a completion token that counts in the loss.

Two registries pick the objective by name (docs/methods.md#objectives-and-advantage-estimators):
`POLICY_LOSSES` (`rl.learner.policy_loss`: grpo, gspo, gspo_token, cispo) and
`ADVANTAGES` (`rl.loop.advantage`: grpo, dr_grpo, rloo, reinforce++,
reinforce++_baseline); either also takes "package.module:function" for one defined
elsewhere.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr import named

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
TIS_LEVELS = ("token", "sequence")


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


# ---------------------------------------------------------- advantage estimators
# An estimator: fn(rewards, lengths, *, ddof) -> advantages. rewards: one [n_g] array per
# group of the whole rollout buffer (groups may differ in size), lengths: the completion
# token counts alike; returns one float32 array per group. The update computes them once
# per buffer, before any mini-batch split, so batch statistics see the whole buffer. A
# group of one response has no baseline of its own and gets 0 from the group-relative
# estimators (verl keeps its raw reward).


def _per_group(rewards, fn):
  return [np.asarray(fn(np.asarray(r, np.float32)), np.float32).reshape(-1) for r in rewards]


def grpo_advantages(rewards, lengths=None, *, ddof: int = 1):
  r"""A_i = (r_i - mean_g r) / (std_g r + 1e-6) within each group (`group_advantages`)."""
  return _per_group(rewards, lambda r: group_advantages(r[None], True, ddof=ddof)[0])


def dr_grpo_advantages(rewards, lengths=None, *, ddof: int = 1):
  r"""A_i = r_i - mean_g r (Dr.GRPO, arXiv 2503.20783: no division by the group std)."""
  return _per_group(rewards, lambda r: group_advantages(r[None], False)[0])


def rloo_advantages(rewards, lengths=None, *, ddof: int = 1):
  r"""RLOO (arXiv 2402.14740): A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean_g r).

  A constant group or a group of one gets exactly 0.
  """

  def one(r):
    n = r.shape[0]
    if n < 2 or np.all(r == r[0]):
      return np.zeros_like(r)
    r = r.astype(np.float64)
    return (r - (r.sum() - r) / (n - 1)).astype(np.float32)

  return _per_group(rewards, one)


def _whiten(values, lengths, ddof: int):
  """(x - mu) / sqrt(var + 1e-8) with mu, var over all completion tokens of the buffer
  (each response's value counted once per token, as verl's masked_whiten over the
  response mask; var with ddof in the token count)."""
  sizes = [len(v) for v in values]
  x = np.concatenate([np.asarray(v, np.float64).reshape(-1) for v in values])
  w = np.concatenate([np.asarray(n, np.float64).reshape(-1) for n in lengths])
  if x.shape != w.shape:
    raise ValueError(f"advantage: {x.size} rewards but {w.size} completion lengths")
  tokens = w.sum()
  if tokens == 0:
    return [np.zeros(n, np.float32) for n in sizes]
  mu = (w * x).sum() / tokens
  var = (w * (x - mu) ** 2).sum() / max(tokens - ddof, 1.0)
  out = ((x - mu) / np.sqrt(var + 1e-8)).astype(np.float32)
  return np.split(out, np.cumsum(sizes)[:-1])


def reinforce_pp_advantages(rewards, lengths, *, ddof: int = 1):
  r"""REINFORCE++ (arXiv 2501.03262, verl's outcome form, gamma 1): every token's return
  is the response's reward, whitened over all tokens of the buffer (no group baseline):
  A_i = (r_i - mu_B) / sqrt(var_B + 1e-8), mu_B, var_B token-weighted (`_whiten`)."""
  return _whiten([np.asarray(r, np.float32) for r in rewards], lengths, ddof)


def reinforce_pp_baseline_advantages(rewards, lengths, *, ddof: int = 1):
  r"""REINFORCE++-baseline (verl): subtract the group mean, then whiten over the buffer:
  c_i = r_i - mean_g r;  A_i = (c_i - mu_B(c)) / sqrt(var_B(c) + 1e-8) (`_whiten`).

  A constant group has c = 0 but, after whitening, A = -mu_B / sigma_B, as in verl.
  """
  centered = [np.asarray(r, np.float64) - np.mean(r) for r in rewards]
  return _whiten(centered, lengths, ddof)


ADVANTAGES: dict[str, Callable] = {
  "grpo": grpo_advantages,
  "dr_grpo": dr_grpo_advantages,
  "rloo": rloo_advantages,
  "reinforce++": reinforce_pp_advantages,
  "reinforce++_baseline": reinforce_pp_baseline_advantages,
}


def advantage_fn(name: str) -> Callable:
  """The estimator `name` selects: a key of ADVANTAGES or "package.module:function"."""
  return named.load("advantage", name, ADVANTAGES, "an estimator")


def advantages(
  name: str, rewards: Sequence[np.ndarray], lengths: Sequence[np.ndarray], ddof: int = 1
) -> list[np.ndarray]:
  """Advantages of a whole buffer, one float32 array per group (see ADVANTAGES)."""
  out = advantage_fn(name)(list(rewards), list(lengths), ddof=ddof)
  if len(out) != len(rewards) or any(np.shape(a) != np.shape(r) for a, r in zip(out, rewards)):
    raise ValueError(f"advantage: {name!r} must return one array per group, shaped as its rewards")
  return [np.asarray(a, np.float32) for a in out]


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
