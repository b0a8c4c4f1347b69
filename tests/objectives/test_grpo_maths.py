"""GRPO maths against a plain numpy transcription of the equations (docs/methods.md#grpo)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr import objectives
from rlvr.learner import packing


# ------------------------------------------------------------- numpy reference
def np_advantages(r, normalize_std=True, eps=1e-6, ddof=1):
  out = np.zeros_like(r, dtype=np.float64)
  for g in range(r.shape[0]):
    row = r[g].astype(np.float64)
    if np.all(row == row[0]):
      continue
    out[g] = row - row.mean()
    if normalize_std:
      out[g] /= row.std(ddof=ddof) + eps
  return out


def np_policy_loss(logp, old, adv, mask, el, eh, dual, agg):
  b, t = logp.shape
  per = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      k = np.exp(logp[i, j] - old[i, j])
      a = adv[i]
      l = max(-k * a, -min(max(k, 1 - el), 1 + eh) * a)
      if dual is not None and a < 0:
        l = min(l, -dual * a)
      per[i, j] = l
  m = mask.astype(bool)
  if agg == "token-mean":
    return per[m].sum() / m.sum()
  rows = [i for i in range(b) if m[i].any()]
  if agg == "seq-mean-token-mean":
    return sum(per[i][m[i]].mean() for i in rows) / len(rows)
  return sum(per[i][m[i]].sum() for i in rows) / len(rows)


def _inputs(seed=0, b=12, t=9):
  rng = np.random.RandomState(seed)
  logp = -rng.rand(b, t) * 3
  old = logp + rng.randn(b, t) * 0.4  # ratios well outside [0.8, 1.28] on both sides
  adv = rng.randn(b)
  adv[3] = 0.0
  mask = (rng.rand(b, t) > 0.3).astype(np.float32)
  mask[5] = 0  # an empty sequence
  return logp, old, adv, mask


def test_advantages_match_numpy_with_zero_variance_groups():
  rng = np.random.RandomState(1)
  r = (rng.rand(16, 8) > 0.5).astype(np.float32)
  r[0] = 1.0
  r[1] = 0.0
  r[2] = 0.7  # constant non-binary group: std 0 (fp noise must not leak through)
  r[3] = rng.rand(8)  # continuous rewards
  for norm in (True, False):
    ours = np.asarray(objectives.group_advantages(jnp.asarray(r), normalize_std=norm))
    np.testing.assert_allclose(ours, np_advantages(r, norm), rtol=1e-5, atol=1e-6)
    assert (ours[:3] == 0).all()


@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_advantages_use_the_unbiased_std_like_verl_and_trl(n):
  """(r - mean) / (std(ddof=1) + eps), as torch.std computes it; ddof 0 on request."""
  rng = np.random.RandomState(n)
  r = (rng.rand(6, n) > 0.5).astype(np.float32)
  r[0], r[1] = 1.0, 0.0  # constant groups: exactly 0
  r[2, :] = 0.0
  r[2, 0] = 1.0  # one right of n
  r[3] = rng.rand(n)  # continuous rewards
  for ddof in (1, 0):
    ours = np.asarray(objectives.group_advantages(jnp.asarray(r), ddof=ddof))
    want = np.zeros((6, n))
    for g in range(6):
      if np.ptp(r[g]) > 0:
        want[g] = (r[g] - r[g].mean()) / (np.std(r[g].astype(np.float64), ddof=ddof) + 1e-6)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)
    assert (ours[:2] == 0).all()
  # one right of two: unbiased std is 1/sqrt(2), population std 1/2
  two = np.asarray(objectives.group_advantages(jnp.asarray([[1.0, 0.0]])))
  np.testing.assert_allclose(
    two, [[0.5 / (np.sqrt(0.5) + 1e-6), -0.5 / (np.sqrt(0.5) + 1e-6)]], rtol=1e-6
  )


@pytest.mark.parametrize("agg", objectives.AGGREGATIONS)
@pytest.mark.parametrize("dual", [None, 3.0])
def test_policy_loss_matches_numpy(agg, dual):
  logp, old, adv, mask = _inputs()
  loss, aux = objectives.policy_loss(
    jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), 0.2, 0.28, dual, agg
  )
  ref = np_policy_loss(logp, old, adv, mask, 0.2, 0.28, dual, agg)
  np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
  ratio = np.exp(logp - old)
  m = mask.astype(bool)
  a = np.broadcast_to(adv[:, None], ratio.shape)
  np.testing.assert_allclose(
    float(aux["clip_frac_low"]), ((ratio < 0.8) & (a < 0))[m].mean(), rtol=1e-6
  )
  np.testing.assert_allclose(
    float(aux["clip_frac_high"]), ((ratio > 1.28) & (a > 0))[m].mean(), rtol=1e-6
  )
  assert float(aux["clip_frac_low"]) > 0 and float(aux["clip_frac_high"]) > 0
  np.testing.assert_allclose(float(aux["ratio_max"]), ratio[m].max(), rtol=1e-6)


def test_dual_clip_changes_loss_for_negative_advantages():
  logp, old, adv, mask = _inputs(seed=2)
  logp = old + 2.0  # ratio e^2 > 3: dual clip is active where A < 0
  args = [jnp.asarray(x) for x in (logp, old, adv, mask)]
  with_dual, aux = objectives.policy_loss(*args, dual_clip=3.0)
  without, _ = objectives.policy_loss(*args, dual_clip=None)
  assert float(with_dual) < float(without)
  assert float(aux["dual_clip_frac"]) > 0


def test_global_normalizer_makes_micro_batch_losses_add_up():
  logp, old, adv, mask = _inputs(seed=3)
  for agg in objectives.AGGREGATIONS:
    full, _ = objectives.policy_loss(
      jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), aggregation=agg
    )
    n = objectives.loss_normalizer(jnp.asarray(mask), agg)
    parts = sum(
      float(
        objectives.policy_loss(
          jnp.asarray(logp[s]),
          jnp.asarray(old[s]),
          jnp.asarray(adv[s]),
          jnp.asarray(mask[s]),
          aggregation=agg,
          normalizer=n,
        )[0]
      )
      for s in (slice(0, 4), slice(4, 8), slice(8, 12))
    )
    np.testing.assert_allclose(parts, float(full), rtol=1e-5)


def test_kl_estimators():
  rng = np.random.RandomState(4)
  logp, ref = -rng.rand(3, 5), -rng.rand(3, 5)
  k1 = np.asarray(objectives.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k1"))
  k3 = np.asarray(objectives.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"))
  np.testing.assert_allclose(k1, logp - ref, rtol=1e-6)
  np.testing.assert_allclose(k3, np.exp(ref - logp) - (ref - logp) - 1, rtol=1e-5, atol=1e-6)
  assert (k3 >= 0).all()


def test_entropy_and_chunked_logprobs_match_dense():
  rng = np.random.RandomState(5)
  b, t, d, v = 2, 13, 8, 37
  hidden = jnp.asarray(rng.randn(b, t, d), jnp.float32)
  head = jnp.asarray(rng.randn(d, v), jnp.float32)
  tokens = jnp.asarray(rng.randint(0, v, (b, t)))
  logits = np.einsum("btd,dv->btv", np.asarray(hidden), np.asarray(head))
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  ent_ref = -(p * np.log(p)).sum(-1)
  np.testing.assert_allclose(
    objectives.entropy_from_logits(jnp.asarray(logits)), ent_ref, rtol=1e-4
  )
  logp, ent = objectives.token_logprobs_and_entropy(hidden, head, tokens, chunk=4)  # 12 = 3 chunks
  logp_ref = np.log(p[:, :-1])[
    np.arange(b)[:, None], np.arange(t - 1)[None], np.asarray(tokens)[:, 1:]
  ]
  np.testing.assert_allclose(np.asarray(logp)[:, 1:], logp_ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent)[:, 1:], ent_ref[:, :-1], rtol=1e-4)
  assert (np.asarray(logp)[:, 0] == 0).all()
  # gradients through the rematerialised chunks equal dense gradients
  g = jax.grad(lambda h: objectives.token_logprobs_and_entropy(h, head, tokens, 5)[0].sum())(hidden)

  def dense(h):
    z = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, head), -1)[:, :-1]
    return jnp.take_along_axis(z, tokens[:, 1:, None], -1).sum()

  np.testing.assert_allclose(g, jax.grad(dense)(hidden), rtol=1e-4, atol=1e-5)
  # at chosen positions only (packing.loss_positions of a mask): the same values there, 0
  # elsewhere, and the gradient of their sum is the dense one of the same positions
  mask = np.zeros((b, t), np.float32)
  mask[0, 4:9], mask[1, 2:4], mask[1, 10:13] = 1, 1, 1
  pos = jnp.asarray(packing.loss_positions(mask, minimum=4))
  assert pos.shape == (b, 8) and int(pos[1, 4]) == 12 and int(pos[1, 5]) == 0
  at = lambda h: objectives.positions_logprobs_and_entropy(h, head, tokens, pos, chunk=3)
  logp_at, ent_at = at(hidden)
  full_logp, full_ent = objectives.token_logprobs_and_entropy(hidden, head, tokens, chunk=4)
  np.testing.assert_allclose(logp_at, np.where(mask, full_logp, 0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ent_at, np.where(mask, full_ent, 0), rtol=1e-5, atol=1e-6)
  g_at = jax.grad(lambda h: at(h)[0].sum())(hidden)
  g_full = jax.grad(
    lambda h: (objectives.token_logprobs_and_entropy(h, head, tokens)[0] * mask).sum()
  )(hidden)
  np.testing.assert_allclose(g_at, g_full, rtol=1e-4, atol=1e-5)


def test_truncated_is_weight():
  old = jnp.asarray([[0.0, -1.0, -2.0]])
  sampler = jnp.asarray([[0.0, -2.0, -0.5]])
  mask = jnp.ones((1, 3))
  w, m = objectives.truncated_is_weight(old, sampler, mask, cap=2.0)
  np.testing.assert_allclose(w, [[1.0, 2.0, np.exp(-1.5)]], rtol=1e-6)
  np.testing.assert_allclose(float(m["mismatch_abs"]), (0 + 1 + 1.5) / 3, rtol=1e-6)
  np.testing.assert_allclose(float(m["is_capped_frac"]), 1 / 3, rtol=1e-6)


def test_bad_aggregation_is_named():
  with pytest.raises(ValueError, match="aggregation.*'sum'"):
    objectives.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), "sum")
