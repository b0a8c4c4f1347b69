"""Advantage estimators: group-relative advantages and the `ADVANTAGES` registry.

`ADVANTAGES` (`rl.learner.advantage`: grpo, dr_grpo, rloo, reinforce++, reinforce++_baseline)
maps a name to its estimator; `advantage_fn` also takes "package.module:function" for
one defined elsewhere.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr.common import named


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
