"""The policy-loss and advantage registries (docs/methods.md#objectives-and-advantage-estimators)
against numpy transcriptions of their papers' equations, forward and gradient; the mismatch
weights per token and per sequence; packed rows equal to one sequence per row; and a loss
registered from outside the library run through `launch.train`."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_run

from rlvr import learner, objectives

EL, EH = 0.2, 0.28

HERE = os.path.dirname(os.path.abspath(__file__))  # this module is the user's module


def _inputs(seed=0, b=6, t=7):
  """logp, old logp (ratios on both sides of the clip range), one advantage per row, a
  ragged mask with one empty row."""
  rng = np.random.RandomState(seed)
  logp = -rng.rand(b, t) * 3 - 0.1
  old = logp + rng.randn(b, t) * 0.5
  adv = rng.randn(b)
  mask = (rng.rand(b, t) > 0.3).astype(np.float32)
  mask[:, 0] = 1
  mask[4] = 0  # an empty sequence
  old[1] = logp[1] + 0.6  # a sequence ratio below 1 - eps_low
  old[2] = logp[2] - 0.6  # and one above 1 + eps_high
  adv[1], adv[2] = -1.0, 1.0
  return logp, old, adv, mask


def _clip_grad(r, a):
  """d/dr of -min(r a, clip(r) a): -a where the unclipped term is the smaller, else 0."""
  unclipped = -a * r >= -a * np.clip(r, 1 - EL, 1 + EH)
  return np.where(unclipped, -a, 0.0)


def np_loss_and_grad(name, logp, old, adv, mask, agg):
  """The loss of `name` and its gradient in logp, transcribed from the equations."""
  m = mask.astype(bool)
  lengths = m.sum(1)
  rows = lengths > 0
  n_tok, n_seq = m.sum(), rows.sum()
  # weight of each token's term in the aggregate
  if agg == "token-mean":
    wt = np.where(m, 1.0 / n_tok, 0.0)
  else:
    wt = np.where(m, 1.0 / (np.maximum(lengths, 1)[:, None] * n_seq), 0.0)
  a = np.broadcast_to(adv[:, None], logp.shape)
  if name in ("gspo", "gspo_token"):
    s_i = np.exp(np.where(m, logp - old, 0).sum(1) / np.maximum(lengths, 1))
    s = np.broadcast_to(s_i[:, None], logp.shape)
    per = np.maximum(-a * s, -a * np.clip(s, 1 - EL, 1 + EH))
    g = _clip_grad(s, a)  # d l / d s
    if name == "gspo":  # s_i = exp(mean_t d_t): every token's term moves with every logp_t
      dl = (wt * g).sum(1, keepdims=True) * s / np.maximum(lengths, 1)[:, None]
    else:  # s_it = sg(s_i) pi_t / sg(pi_t): only its own term, d s_it / d logp_t = s_i
      dl = wt * g * s
  elif name == "cispo":
    k = np.exp(logp - old)
    per = -np.clip(k, 1 - EL, 1 + EH) * a * logp
    dl = wt * -np.clip(k, 1 - EL, 1 + EH) * a
  return (wt * per).sum(), np.where(m, dl, 0.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo"])
def test_policy_losses_match_their_equations(name, agg):
  logp, old, adv, mask = _inputs()
  want, want_grad = np_loss_and_grad(name, logp, old, adv, mask, agg)
  f = lambda lp: objectives.policy_loss(
    lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), EL, EH, 3.0, agg, loss=name
  )
  (loss, aux), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
  assert float(aux["clip_frac_low"]) > 0 and float(aux["clip_frac_high"]) > 0
  if name == "cispo":  # every token keeps a gradient, clipped or not
    assert (np.asarray(grad)[mask.astype(bool) & (adv[:, None] != 0)] != 0).all()
  else:  # a clipped sequence gives no gradient
    assert not np.asarray(grad)[1].any() and not np.asarray(grad)[2].any()


def test_gspo_variants_share_the_value_and_the_sequence_gradient():
  """GSPO-token has GSPO's value and, with one advantage per sequence and the sequence
  mean aggregation, its gradient; the paper's claim, here on the code."""
  logp, old, adv, mask = _inputs(seed=1)
  f = lambda name: jax.value_and_grad(
    lambda lp: objectives.policy_loss(
      lp,
      jnp.asarray(old),
      jnp.asarray(adv),
      jnp.asarray(mask),
      EL,
      EH,
      None,
      "seq-mean-token-mean",
      loss=name,
    )[0]
  )(jnp.asarray(logp, jnp.float32))
  (va, ga), (vb, gb) = f("gspo"), f("gspo_token")
  np.testing.assert_allclose(float(va), float(vb), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ga), np.asarray(gb), rtol=1e-5, atol=1e-8)


def test_grpo_entry_is_the_clipped_surrogate():
  logp, old, adv, mask = (jnp.asarray(x) for x in _inputs(seed=2))
  for dual in (None, 3.0):
    a = objectives.policy_loss(logp, old, adv, mask, EL, EH, dual)
    b = objectives.policy_loss(logp, old, adv, mask, EL, EH, dual, loss="grpo")
    assert float(a[0]) == float(b[0])


def _pack_pairs(x_bt):
  """[2R, T] rows -> [R, 2T] rows holding rows 2r and 2r+1 side by side (ids 1 and 2)."""
  return np.concatenate([x_bt[0::2], x_bt[1::2]], axis=1)


def _value_and_grad(name, agg, logp, old, adv, mask, sequences=None):
  f = lambda lp: objectives.policy_loss(
    lp,
    jnp.asarray(old),
    jnp.asarray(adv),
    jnp.asarray(mask),
    EL,
    EH,
    3.0,
    agg,
    sequences_bt=None if sequences is None else jnp.asarray(sequences),
    loss=name,
  )[0]
  v, g = jax.value_and_grad(f)(jnp.asarray(logp, jnp.float32))
  return float(v), np.asarray(g)


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token", "cispo"])
def test_packed_sequences_give_the_per_row_loss_and_gradient(name):
  logp, old, adv, mask = _inputs(seed=3, b=6, t=5)
  seq = np.concatenate([np.ones((3, 5), np.int32), np.full((3, 5), 2, np.int32)], axis=1)
  adv_bt = np.broadcast_to(adv[:, None], logp.shape)
  packed = [_pack_pairs(x) for x in (logp, old, adv_bt, mask)]
  for agg in objectives.AGGREGATIONS:
    want_v, want_g = _value_and_grad(name, agg, logp, old, adv, mask)
    got_v, got_g = _value_and_grad(name, agg, *packed, seq)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5)
    np.testing.assert_allclose(got_g, _pack_pairs(want_g), rtol=1e-5, atol=1e-8)


def test_mismatch_weights_per_token_and_per_sequence():
  old = np.log(np.array([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]))
  sampler = old - np.array([[0.0, 0.2, -0.2, 0.0], [1.5, 1.5, 0.0, 0.0], [0.9, 0.9, 9.0, 9.0]])
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], np.float32)  # row 3: 2 tokens
  args = [jnp.asarray(x, jnp.float32) for x in (old, sampler, mask)]
  w, m = objectives.truncated_is_weight(*args, cap=2.0)
  np.testing.assert_allclose(np.asarray(w), np.minimum(np.exp(old - sampler), 2.0), rtol=1e-6)
  w, m = objectives.truncated_is_weight(*args, cap=2.0, level="sequence", mask_cap=5.0)
  geo = np.exp([0.0, 1.5, 0.9])  # mean log ratio of each sequence over its masked tokens
  want = np.minimum(geo, 2.0)  # every geometric ratio within [1/5, 5]
  np.testing.assert_allclose(np.asarray(w), np.broadcast_to(want[:, None], (3, 4)), rtol=1e-6)
  assert float(m["is_capped_frac"]) == pytest.approx(4 / 7)  # two sequences, 2 + 2 tokens
  assert float(m["seq_masked_frac"]) == 0.0
  w, m = objectives.truncated_is_weight(*args, cap=None, level="sequence", mask_cap=3.0)
  np.testing.assert_allclose(np.asarray(w)[:, 0], [1.0, 0.0, 1.0])  # e^1.5 > 3 > e^0.9
  assert float(m["seq_masked_frac"]) == pytest.approx(1 / 3) and float(m["is_capped_frac"]) == 0
  with pytest.raises(ValueError, match="tis_level"):
    objectives.truncated_is_weight(*args, level="row")
  # packed: rows 0 and 1 side by side in one row, row 2 alone, one empty segment slot
  packed = [np.stack([np.concatenate(x[:2]), np.pad(x[2], (0, 4))]) for x in (old, sampler, mask)]
  seq = np.array([[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]], np.int32)
  wp, mp = objectives.truncated_is_weight(
    *(jnp.asarray(x, jnp.float32) for x in packed), None, "sequence", 3.0, jnp.asarray(seq)
  )
  np.testing.assert_allclose(np.asarray(wp)[:, [0, 4]], [[1.0, 0.0], [1.0, 1.0]])  # 1 on padding
  assert float(mp["seq_masked_frac"]) == pytest.approx(1 / 3)


# ------------------------------------------------------------------ advantages
def np_whiten(x, w, ddof=1):
  mu = (w * x).sum() / w.sum()
  var = (w * (x - mu) ** 2).sum() / (w.sum() - ddof)
  return (x - mu) / np.sqrt(var + 1e-8)


def _groups():
  """Groups of 1, 2, 4 and 5 responses: mixed, constant, continuous rewards."""
  rewards = [
    np.array([1.0]),
    np.array([1.0, 0.0]),
    np.array([0.0, 0.0, 0.0, 0.0]),  # constant
    np.array([0.3, 1.0, 0.0, 0.7, 0.2]),
    np.array([1.0, 1.0, 1.0, 1.0]),  # constant
  ]
  lengths = [
    np.array([3]),
    np.array([5, 2]),
    np.array([1, 4, 4, 6]),
    np.arange(1, 6),
    np.array([2, 2, 2, 2]),
  ]
  return [r.astype(np.float32) for r in rewards], lengths


def np_estimator(name, rewards, lengths, ddof=1):
  """The estimators' definitions, group by group and over the whole buffer."""
  out = []
  for r in rewards:
    r = r.astype(np.float64)
    n, const = len(r), np.ptp(r) == 0
    if name == "grpo":
      out.append(np.zeros(n) if const else (r - r.mean()) / (r.std(ddof=ddof) + 1e-6))
    elif name == "dr_grpo":
      out.append(np.zeros(n) if const else r - r.mean())
    elif name == "rloo":
      out.append(
        np.zeros(n) if const else np.array([r[i] - np.delete(r, i).mean() for i in range(n)])
      )
    else:
      out.append(r if name == "reinforce++" else r - r.mean())
  if name.startswith("reinforce++"):
    flat = np_whiten(np.concatenate(out), np.concatenate(lengths).astype(np.float64), ddof)
    out = np.split(flat, np.cumsum([len(r) for r in rewards])[:-1])
  return out


@pytest.mark.parametrize("name", sorted(objectives.ADVANTAGES))
def test_advantages_match_their_definitions(name):
  rewards, lengths = _groups()
  for ddof in (1, 0):
    got = objectives.advantages(name, rewards, lengths, ddof)
    for g, w in zip(got, np_estimator(name, rewards, lengths, ddof)):
      assert g.dtype == np.float32 and g.shape == w.shape
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  got = objectives.advantages(name, rewards, lengths)
  if name in ("grpo", "dr_grpo", "rloo"):  # a group of one and constant groups: exactly 0
    assert not got[0].any() and not got[2].any() and not got[4].any()
  if name == "reinforce++_baseline":  # constant groups share one value after whitening
    assert got[2][0] == got[4][0] != 0
  if name == "grpo":  # the group advantages every update has always used, bit for bit
    for r, g in zip(rewards[1:], got[1:]):
      assert np.array_equal(g, np.asarray(objectives.group_advantages(jnp.asarray(r)[None]))[0])


def test_buffer_of_equal_rewards_whitens_to_zero():
  for name in ("reinforce++", "reinforce++_baseline"):
    got = objectives.advantages(name, [np.ones(3, np.float32)] * 2, [np.ones(3)] * 2)
    assert all(not g.any() for g in got)


# --------------------------------------------------------------- registries
def shifted_estimator(rewards, lengths, *, ddof):
  """A user's estimator (registered as "test_objectives:shifted_estimator")."""
  return [np.asarray(r, np.float32) - 0.5 for r in rewards]


def test_names_select_resolve_and_fail_in_one_line():
  assert objectives.policy_loss_fn("gspo") is objectives.gspo_loss
  assert objectives.policy_loss_fn("rlvr.objectives.losses:cispo_loss") is objectives.cispo_loss
  with pytest.raises(ValueError, match=r"^policy_loss: unknown 'ppo'; known: \['cispo', 'grpo'"):
    learner.LearnerConfig(policy_loss="ppo")
  with pytest.raises(ValueError, match=r"^policy_loss: cannot load 'no_such_module:f'"):
    learner.LearnerConfig(policy_loss="no_such_module:f")
  with pytest.raises(ValueError, match=r"^advantage: unknown 'ppo'; known: \['dr_grpo', 'grpo'"):
    learner.LearnerConfig(advantage="ppo")
  for field, bad in (("tis_level", "row"), ("seq_mask_cap", 1.0)):
    with pytest.raises(ValueError, match=field):
      learner.LearnerConfig(**{field: bad})
  # normalize_std keeps its meaning: False is Dr.GRPO
  assert learner.LearnerConfig().advantage_estimator == "grpo"
  assert learner.LearnerConfig(normalize_std=False).advantage_estimator == "dr_grpo"
  assert learner.LearnerConfig(advantage="rloo").advantage_estimator == "rloo"
  with pytest.raises(ValueError, match="normalize_std"):
    learner.LearnerConfig(advantage="rloo", normalize_std=False)
  sys.path.insert(0, HERE)
  try:
    got = objectives.advantages("test_objectives:shifted_estimator", [np.ones(2)], [np.ones(2)])
  finally:
    sys.path.pop(0)
  np.testing.assert_array_equal(got[0], [0.5, 0.5])


def fixed_value_loss(logp_bt, old_logp_bt, advantages, mask_bt, **clip):
  """A user's loss (registered as "test_objectives:fixed_value_loss"): GRPO's gradient,
  but every term's value is 7, so the run's logged pg_loss shows which loss it used."""
  per_token, ratio = objectives.grpo_loss(logp_bt, old_logp_bt, advantages, mask_bt, **clip)
  return per_token - jax.lax.stop_gradient(per_token) + 7.0, ratio


@pytest.mark.slow
def test_a_loss_defined_outside_the_library_trains_through_launch_train(tmp_path):
  flags = [
    "--config.sft.steps=0",
    "--config.data.arithmetic.n_sft=0",
    "--config.data.arithmetic.n_heldout=8",
    "--config.eval.sampling.n=1",
    "--config.rl.steps=2",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.loop.prompts_per_step=4",
    "--config.rl.learner.ppo_mini_batch_size=0",
    "--config.rl.learner.advantage=rloo",
    "--config.rl.learner.policy_loss=test_objectives:fixed_value_loss",
    "--config.export_hf=False",
  ]
  _, rows = tiny_run.train(tmp_path, *flags, environ=tiny_run.env(HERE), timeout=900)
  assert [r["step"] for r in rows] == [0, 1]
  for r in rows:
    assert r["pg_loss"] == pytest.approx(7.0, rel=1e-6)
