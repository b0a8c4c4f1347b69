"""Several optimizer steps per rollout batch (verl's PPO mini-batches): one mini-batch is
the single-step update bit for bit; with four, the later steps are off-policy (ratio != 1,
clipping binds) and equal a hand-run sequence of single updates with the same old logprobs."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from rules import even_length
from step_context import InOrder, step_context
from transformers import AutoTokenizer

from rlvr import learner, model
from rlvr.learner import packing, ppo
from rlvr.rollout import Prompt, RLConfig
from rlvr.sampling import JaxSampler

RL = RLConfig(prompts_per_step=8, group_size=4, max_prompt_len=8, max_response_len=8)
SHAPE = RL.batch_shape
LR = 3e-2  # large, so that later mini-batches move the ratio past the clip range
LC = learner.LearnerConfig(learning_rate=LR)  # one sequence per row, GRPO's advantages
PACKED = dataclasses.replace(LC, pack=True, pack_len=48, pack_min_rows=2)


@pytest.fixture(scope="module")
def rollout(tiny_dirs):
  """Eight mixed groups sampled from the tiny model, and what the learner needs."""
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  ctx = step_context(JaxSampler(cfg, params, tok), even_length, tok, rl=RL)
  prompts = [Prompt((5 + i, 6 + i, 7 + i), "0") for i in range(64)]
  kept, _, _ = ctx.gather(InOrder(prompts), step=0)
  assert len(kept) == RL.prompts_per_step
  return cfg, params, tok.pad_token_id, kept


def _params(state):
  return jax.tree.leaves(jax.device_get(state.params))


def test_one_mini_batch_is_the_single_step_update_bit_for_bit(rollout, one_device_learner):
  cfg, params, pad, groups = rollout
  results = []
  for fields in ({}, {"ppo_mini_batch_size": RL.prompts_per_step}):
    lrn = one_device_learner(cfg, params, LR, rl=RL, pad_id=pad, **fields)
    lrn.logp_fn = None  # one optimizer step needs none
    m = lrn.update(groups, step=0)
    assert m["optimizer_steps"] == 1 and m["ratio_max"] == 1.0
    results.append(_params(lrn.state))
  lrn = one_device_learner(cfg, params, LR)  # the update called directly
  state, _ = lrn.update_fn(lrn.state, lrn.to_batch(packing.build_batch(groups, LC, SHAPE, pad)))
  for a, b, c in zip(*results, _params(state)):
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_four_mini_batches_are_off_policy_and_equal_single_updates(rollout, one_device_learner):
  cfg, params, pad, groups = rollout
  lc = dataclasses.replace(LC, ppo_mini_batch_size=2)
  logp_fn = learner.make_logprob_fn(cfg, lc)
  chunks = ppo.mini_batches(groups, lc, np.random.default_rng(0))
  assert [len(c) for c in chunks] == [2, 2, 2, 2]
  assert sorted(id(g) for c in chunks for g in c) == sorted(id(g) for g in groups)

  lrn = one_device_learner(cfg, params, LR)
  build = lambda c: packing.build_batch(c, lc, SHAPE, pad, min_rows=SHAPE.mini_batch_rows(lc))
  batches = [lrn.to_batch(build(c)) for c in chunks]
  assert batches[0].tokens_bt.shape[0] == 2 * RL.group_size
  state, steps, kl = ppo.multi_step_update(lrn.state, lrn.update_fn, logp_fn, batches)
  assert len(steps) == 4 and kl > 0
  assert float(steps[0]["ratio_max"]) == pytest.approx(1.0, abs=1e-5)
  later = steps[1:]
  assert any(
    abs(float(m["ratio_max"]) - 1) > 1e-3 or abs(float(m["ratio_min"]) - 1) > 1e-3 for m in later
  )
  assert any(float(m["clip_frac_low"]) + float(m["clip_frac_high"]) > 0 for m in later)

  # By hand: old logprobs of every mini-batch under the first policy, then one update each.
  other = one_device_learner(cfg, params, LR)
  hand = other.state
  old = [logp_fn(hand.params, b) for b in batches]
  for i, (b, o) in enumerate(zip(batches, old)):
    hand, m = other.update_fn(hand, b.replace(old_logp_bt=o))
    for k in ("loss", "clip_frac_low", "clip_frac_high", "ratio_max", "ratio_min", "grad_norm"):
      assert float(m[k]) == float(steps[i][k]), (i, k)
  for a, b in zip(_params(state), _params(hand)):
    assert np.array_equal(a, b)


def test_the_learner_reports_the_steps_of_a_buffer(rollout, one_device_learner):
  cfg, params, pad, groups = rollout
  lrn = one_device_learner(cfg, params, LR, rl=RL, pad_id=pad, ppo_mini_batch_size=4, ppo_epochs=2)
  m = lrn.update(groups, step=3)
  assert m["optimizer_steps"] == 4 and int(lrn.state.step) == 4
  assert m["kl_first_last"] > 0 and m["ratio_min"] <= 1.0 <= m["ratio_max"]
  lrn.logp_fn = None
  with pytest.raises(ValueError, match="logp_fn"):
    lrn.update(groups, step=3)


def test_first_fit_and_packed_layout():
  assert packing.first_fit([5, 9, 3, 7, 4], 12) == [[1, 2], [3, 0], [4]]  # 9+3, 7+5, 4
  assert packing.first_fit([20, 2], 8) == [[0], [1]]  # too long: a row to itself
  rows = [((1, 2), (3, 4, 5), [-0.1, -0.2, -0.3]), ((6,), (7,), None), ((8, 9, 10), (11,), None)]
  a = packing.pack_rows(rows, 3, 8, pad_id=0, bins=[[0, 1], [2]])
  assert a["tokens_bt"][0].tolist() == [1, 2, 3, 4, 5, 6, 7, 0]
  assert a["segment_bt"][0].tolist() == [1, 1, 1, 1, 1, 2, 2, 0]
  assert a["positions_bt"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0]
  assert a["loss_mask_bt"][0].tolist() == [0, 0, 1, 1, 1, 0, 1, 0]
  assert a["sampler_logp_bt"][0, 2:5].tolist() == pytest.approx([-0.1, -0.2, -0.3])
  assert a["sequence_bt"][1].tolist() == [2] * 4 + [-1] * 4
  assert not a["segment_bt"][2].any()
  with pytest.raises(ValueError, match="n_rows=1"):
    packing.pack_rows(rows, 1, 8, bins=[[0], [1, 2]])


@pytest.mark.parametrize(
  "aggregation,objective",
  [
    ("token-mean", {}),
    ("seq-mean-token-mean", {}),
    (
      "seq-mean-token-mean",
      dict(policy_loss="gspo", tis_cap=2.0, tis_level="sequence", seq_mask_cap=2.0),
    ),
    ("token-mean", dict(policy_loss="cispo")),
  ],
)
def test_packed_rows_give_the_unpacked_update(rollout, one_device_learner, aggregation, objective):
  """The same groups, one sequence per row or packed several to a row: the same
  logprobs and the same optimizer step (two micro-batches, truncated completions
  masked, each aggregation, GSPO with sequence-level mismatch correction, CISPO), on
  far fewer padding tokens."""
  cfg, params, pad, groups = rollout
  plain, packed = (packing.build_batch(groups, lc, SHAPE, pad) for lc in (LC, PACKED))
  assert packed["segment_bt"].max() > 2
  assert packed["tokens_bt"].size < plain["tokens_bt"].size
  assert (packed["segment_bt"] == 0).sum() <= (plain["segment_bt"] == 0).sum() / 2  # padding
  assert packed["loss_mask_bt"].sum() == plain["loss_mask_bt"].sum()
  assert packed["truncated"].shape == packed["tokens_bt"].shape
  assert packed["truncated"].sum() > 0  # some sampled completions hit max_response_len
  assert np.sort(packed["advantages"][packed["loss_mask_bt"] > 0]).tolist() == pytest.approx(
    np.sort(np.repeat(plain["advantages"], plain["loss_mask_bt"].sum(1).astype(int)))
  )

  lc = dict(aggregation=aggregation, mask_truncated=True, micro_batches=2, **objective)
  logp_fn = learner.make_logprob_fn(cfg, learner.LearnerConfig(**lc))
  results = []
  for arrays in (plain, packed):
    lrn = one_device_learner(cfg, params, 1e-3, **lc)
    batch = lrn.to_batch(arrays)
    logp = np.asarray(logp_fn(lrn.state.params, batch))[arrays["loss_mask_bt"] > 0]
    state, m = lrn.update_fn(lrn.state, batch)
    results.append((np.sort(logp), {k: float(v) for k, v in m.items()}, _params(state)))
  (lp_a, m_a, p_a), (lp_b, m_b, p_b) = results
  np.testing.assert_allclose(lp_a, lp_b, atol=2e-5)  # sorted: one value per loss token
  for k in ("loss", "grad_norm", "tokens", "entropy", "logp", "seq_masked_frac"):
    if k in m_a:
      assert m_b[k] == pytest.approx(m_a[k], rel=1e-4, abs=1e-6), k
  for a, b in zip(p_a, p_b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_old_logprobs_are_computed_per_micro_batch(rollout):
  """`make_logprob_fn` splits the batch as the update does (a training micro-batch's
  memory, not the whole buffer's) and puts every row back in place."""
  cfg, params, pad, groups = rollout
  batch = learner.TrainBatch(
    **{k: jax.numpy.asarray(v) for k, v in packing.build_batch(groups, LC, SHAPE, pad).items()}
  )
  whole, split = (
    np.asarray(learner.make_logprob_fn(cfg, learner.LearnerConfig(micro_batches=m))(params, batch))
    for m in (1, 4)
  )
  np.testing.assert_allclose(split, whole, rtol=1e-5, atol=1e-5)
  assert np.abs(whole).sum() > 0


def test_advantages_are_taken_over_the_whole_buffer(rollout):
  """`build_batch` places the advantages it is given on every token of their sequence (one
  sequence per row or packed); left out, it computes GRPO's for its groups; a
  batch-normalised estimator split into mini-batches keeps the whole buffer's statistics."""
  _, _, pad, groups = rollout
  marks = [np.arange(len(g.completions), dtype=np.float32) + 10 * k for k, g in enumerate(groups)]
  for lc in (LC, PACKED):
    arrays = packing.build_batch(groups, lc, SHAPE, pad, advantages=marks)
    adv, seg, mask = arrays["advantages"], arrays["segment_bt"], arrays["loss_mask_bt"] > 0
    if lc.pack:  # per token: one value on each sequence, each given value on one sequence
      seen = [
        set(adv[r][mask[r] & (seg[r] == s)].tolist())
        for r in range(mask.shape[0])
        for s in set(seg[r][mask[r]].tolist())
      ]
      assert all(len(v) == 1 for v in seen)
      assert sorted(x for v in seen for x in v) == sorted(np.concatenate(marks))
    else:  # per row
      n = sum(len(m) for m in marks)
      assert np.array_equal(adv[:n], np.concatenate(marks)) and not adv[n:].any()
    grpo = packing.build_batch(groups, lc, SHAPE, pad)
    given = packing.build_batch(
      groups, lc, SHAPE, pad, advantages=packing.group_advantages(groups, lc)
    )
    assert np.array_equal(grpo["advantages"], given["advantages"])
  with pytest.raises(ValueError, match="advantages for"):
    packing.build_batch(groups, LC, SHAPE, pad, advantages=marks[:-1])
  lc = dataclasses.replace(LC, ppo_mini_batch_size=2, advantage="reinforce++")
  whole = packing.group_advantages(groups, lc)
  lengths = [len(c.token_ids) for g in groups for c in g.completions]
  flat = np.concatenate(whole)
  assert np.average(flat, weights=lengths) == pytest.approx(0.0, abs=1e-5)  # whitened
  for chunk in ppo.mini_batches(list(zip(groups, whole)), lc, np.random.default_rng(0)):
    mini, adv = zip(*chunk)
    arrays = packing.build_batch(
      mini, lc, SHAPE, pad, advantages=adv, min_rows=SHAPE.mini_batch_rows(lc)
    )
    n = sum(len(a) for a in adv)
    assert np.array_equal(arrays["advantages"][:n], np.concatenate(adv))
    assert not np.allclose(np.concatenate(packing.group_advantages(mini, lc)), np.concatenate(adv))
