"""Reward shaping (DAPO overlong punishment, QbQ format bonus) and QbQ's all-m loss normaliser."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlvr import learner, model
from rlvr.learner import packing
from rlvr.rewards import shaping

L_MAX, L_CACHE = 100, 20


@pytest.mark.parametrize(
  "length, penalty",
  [
    (L_MAX - L_CACHE - 1, 0.0),  # before the cache: nothing
    (L_MAX - L_CACHE, 0.0),  # the cache starts after L_max - L_cache tokens
    (L_MAX - L_CACHE // 2, -0.5),  # half-way through the cache
    (L_MAX, -1.0),  # at L_max: the whole penalty
    (L_MAX + 5, -1.0),  # beyond: -1
  ],
)
def test_overlong_penalty_is_dapos_linear_ramp(length, penalty):
  got = shaping.overlong_penalty([length], L_MAX, L_CACHE)
  np.testing.assert_allclose(got, [penalty], atol=1e-7)


def test_overlong_off_and_config_errors():
  assert (shaping.overlong_penalty([10, 10_000], 100, 0) == 0).all()
  with pytest.raises(ValueError, match="overlong_cache"):
    shaping.ShapingConfig(overlong_cache=50, overlong_max=20)
  with pytest.raises(ValueError, match="format_bonus"):
    shaping.ShapingConfig(format_bonus=float("nan"))


def test_shape_adds_format_bonus_and_penalty_onto_correctness():
  cfg = shaping.ShapingConfig(format_bonus=0.1, overlong_cache=L_CACHE)
  rewards, terms = shaping.shape(
    [1.0, 0.0, 1.0, 0.0],
    [10, 10, L_MAX - 10, L_MAX],
    [True, True, True, False],
    cfg,
    max_response_len=L_MAX,
  )
  np.testing.assert_allclose(terms["shaping_format"], [0.1, 0.1, 0.1, 0.0], atol=1e-7)
  np.testing.assert_allclose(terms["shaping_overlong"], [0.0, 0.0, -0.5, -1.0], atol=1e-7)
  np.testing.assert_allclose(rewards, [1.1, 0.1, 0.6, -1.0], atol=1e-6)
  assert not shaping.ShapingConfig().active


def test_all_m_normaliser_divides_by_every_completion(tiny_dirs):
  """QbQ Eq. 2: seq-mean-token-mean over all m completions, truncated ones masked out."""
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  rows = [
    ((5, 6, 7), (8, 9, 10, 11), None),
    ((5, 6, 7), (12, 13), None),
    ((5, 6, 7), (14, 15, 16), None),
    ((5, 6, 7), (17, 18, 19, 20, 21), None),
  ]
  arrays = packing.pack_rows(rows, 4, 16)
  arrays.update(
    advantages=np.array([1.0, -1.0, 0.5, -0.5], np.float32),
    truncated=np.array([False, False, False, True]),
  )
  batch = learner.TrainBatch(**{k: jax.device_put(v) for k, v in arrays.items()})
  loss = {}
  for normalize_all in (False, True):
    lc = learner.LearnerConfig(
      aggregation="seq-mean-token-mean", mask_truncated=True, normalize_all=normalize_all
    )  # loss of the step's own params
    mesh = jax.sharding.Mesh(
      np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor")
    )
    state = learner.init_state(cfg, lc, params, mesh)
    _, m = learner.make_update_fn(cfg, lc, mesh)(state, batch)
    loss[normalize_all] = float(m["pg_loss"])
  assert loss[False] != 0
  np.testing.assert_allclose(loss[True], loss[False] * 3 / 4, rtol=1e-6)
