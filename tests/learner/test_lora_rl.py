"""LoRA in the GRPO update: the adapters' gradient is the chain rule through the merged
kernels, fresh adapters start as the base (ratio 1, KL 0 to the base, which is the
reference: no second model), the base never moves and stays in the compute dtype, and
every policy loss trains the adapters."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import learner_worker as worker
import numpy as np
import optax
import pytest
from flax import traverse_util
from test_moe import MOE_CONFIGS

from rlvr import learner, model, objectives
from rlvr.learner import update as update_lib
from rlvr.model import lora
from rlvr.model.lora import LoraConfig
from rlvr.parallel import sharding

LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0)


@pytest.fixture(scope="module")
def qwen2(tiny_dirs):
  return model.load_hf(tiny_dirs["qwen2"])


def _mesh():
  return sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])


def _batch(cfg, step=0, old_from=None, lc=None):
  """learner_worker's batch; old_from: params whose logprobs are the old ones."""
  batch = learner.TrainBatch(**worker.make_batch(step, cfg.vocab_size))
  if old_from is not None:
    old = learner.make_logprob_fn(cfg, lc)(old_from, batch)
    batch = batch.replace(old_logp_bt=old)
  return batch


def _random_b(adapters, seed=1, std=0.05):
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
    lambda p, x: (
      jnp.asarray(rng.randn(*x.shape).astype(np.float32) * std) if p[-1].key == "lora_b" else x
    ),
    adapters,
  )


MIXED_MOE = dict(family="qwen3_moe", **MOE_CONFIGS["mixed"])  # 3 stacks: sparse, dense, sparse


@pytest.mark.parametrize(
  "family,scan_layers,targets",
  [
    ("qwen2", True, lora.ALL_LINEAR),
    ("qwen2", False, lora.ALL_LINEAR),
    ("moe", True, ("*",)),  # every stack's attention, the dense layer's MLP, the LM head;
    # with routing replay
  ],
)
def test_adapters_beside_the_base_equal_the_merged_model(
  tiny_dirs, tmp_path, family, scan_layers, targets
):
  """The learner's forward keeps the layer stacks' adapters apart from the base (x @ W +
  x @ A @ sB inside each layer): log-probs and entropies equal the merged model's."""
  if family == "moe":
    cfg, params = model.load_hf(model.make_tiny(str(tmp_path / "moe"), seed=3, **MIXED_MOE))
    assert len({g.name for g in model.decoder.layer_groups(cfg)}) == 3
  else:
    cfg, params = model.load_hf(tiny_dirs[family])
  lc_cfg = LoraConfig(rank=4, alpha=8.0, dropout=0.0, targets=targets)
  adapters = _random_b(lora.init_adapters(params, lc_cfg, jax.random.key(2)))
  lc = worker.learner_config(lora=lc_cfg, scan_layers=scan_layers, routing_replay=True)
  batch = _batch(cfg, 3)
  if cfg.is_moe:  # routing replay: given experts per token and sparse layer
    b, t = batch.tokens_bt.shape
    draw = np.random.RandomState(5).rand(b, t, cfg.num_sparse_layers, cfg.num_experts)
    routes = np.argsort(draw, -1)[..., : cfg.num_experts_per_tok].astype(np.int32)
    batch = batch.replace(routes_bt=jnp.asarray(routes))
  apart = learner.logprobs.sequence_logprobs(lora.Adapted(params, adapters, lc_cfg), batch, cfg, lc)
  merged = learner.logprobs.sequence_logprobs(lora.merge(params, adapters, lc_cfg), batch, cfg, lc)
  base = learner.logprobs.sequence_logprobs(params, batch, cfg, lc)
  assert float(jnp.abs(merged[0] - base[0]).max()) > 1e-2  # the adapters matter
  if cfg.is_moe:  # and the given routes are the ones used
    free = learner.logprobs.sequence_logprobs(
      lora.merge(params, adapters, lc_cfg), batch.replace(routes_bt=None), cfg, lc
    )
    assert float(jnp.abs(merged[0] - free[0]).max()) > 1e-3
  for a, m in zip(apart, merged):
    np.testing.assert_allclose(np.asarray(a), np.asarray(m), rtol=0, atol=2e-5)


def test_adapter_gradient_is_the_chain_rule_through_the_merged_kernels(qwen2):
  """Reference: autodiff of the loss with respect to the merged model's kernels W', then
  dA = s dW' B^T and dB = s A^T dW' by hand. The learner's gradient is read off one
  train_step with plain SGD at learning rate 1 (params_after = params - grad)."""
  cfg, params = qwen2
  lc = worker.learner_config(lora=LORA, grad_clip=0.0, kl_beta=0.0)
  state = learner.new_state(params, jax.random.PRNGKey(0), lc)
  state = state.replace(params=_random_b(state.params))
  merged = lora.merge(state.base, state.params, LORA)
  batch = _batch(cfg, 1, old_from=jax.tree.map(lambda x: x * 0.99, merged), lc=lc)

  sgd = optax.sgd(1.0)
  step = jax.jit(functools.partial(update_lib.train_step, model_cfg=cfg, cfg=lc, tx=sgd))
  after, _ = step(state.replace(opt_state=sgd.init(state.params)), batch)
  got = jax.tree.map(lambda a, b: a - b, state.params, after.params)

  normalizer = objectives.loss_normalizer(
    learner.loss_mask(batch, lc), lc.aggregation, batch.sequences_bt
  )
  d_merged = jax.grad(lambda p: update_lib.micro_loss(p, None, batch, normalizer, cfg, lc)[0])(
    merged
  )
  d_flat = traverse_util.flatten_dict(d_merged)
  ad = traverse_util.flatten_dict(state.params)
  got_flat = traverse_util.flatten_dict(got)
  checked = 0
  for path in sorted({p[:-1] for p in ad}):
    a, b = np.asarray(ad[path + ("lora_a",)]), np.asarray(ad[path + ("lora_b",)])
    layers, r = a.shape[0], a.shape[-1]
    a2, b2 = a.reshape(layers, -1, r), b.reshape(layers, r, -1)
    dw = np.asarray(d_flat[path]).reshape(layers, a2.shape[1], b2.shape[2])
    want_a = LORA.scale * dw @ np.swapaxes(b2, 1, 2)
    want_b = LORA.scale * np.swapaxes(a2, 1, 2) @ dw
    for name, want in (("lora_a", want_a), ("lora_b", want_b)):
      have = np.asarray(got_flat[path + (name,)]).reshape(want.shape)
      scale = np.abs(want).max()
      assert scale > 0, (path, name)
      np.testing.assert_allclose(have, want, rtol=0, atol=1e-5 * max(scale, 1.0), err_msg=str(path))
      checked += 1
  assert checked == 14  # A and B of q, k, v, o, gate, up, down


def test_fresh_adapters_start_as_the_base_and_the_base_is_the_kl_reference(qwen2):
  """B = 0: the first update sees the base's log-probs (ratio exactly 1, KL to the base 0);
  the state holds no reference copy; after a few steps the KL to the base grows while
  the base stays bit-identical, in the compute dtype."""
  cfg, params = qwen2
  lc = worker.learner_config(lora=LORA, learning_rate=1e-2, kl_beta=0.1, compute_dtype="float32")
  state = learner.init_state(cfg, lc, params, _mesh())  # a copy: the update donates it
  assert state.ref_params is None and learner.reference_params(state) is state.base
  fn = learner.make_logprob_fn(cfg, lc)
  batch = _batch(cfg, 0, old_from=params, lc=lc)
  np.testing.assert_array_equal(
    np.asarray(fn(learner.policy_params(state), batch)), np.asarray(batch.old_logp_bt)
  )
  base = jax.tree.map(np.asarray, state.base)
  update = learner.make_update_fn(cfg, lc, _mesh())
  state, m = update(state, batch)
  assert float(m["ratio_max"]) == 1.0 and float(m["ratio_min"]) == 1.0
  assert float(m["kl"]) == 0.0
  kls = []
  for step in (1, 2, 3):
    state, m = update(state, _batch(cfg, step, old_from=learner.policy_params(state), lc=lc))
    kls.append(float(m["kl"]))
  assert kls[-1] > 0 and kls[-1] > kls[0]
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), y), state.base, base)


def test_the_base_is_held_in_the_compute_dtype(qwen2):
  cfg, params = qwen2
  lc = worker.learner_config(lora=LORA, compute_dtype="bfloat16")
  shapes = jax.eval_shape(lambda p: learner.new_state(p, jax.random.PRNGKey(0), lc), params)
  assert {x.dtype for x in jax.tree.leaves(shapes.base)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(shapes.params)} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("policy_loss", sorted(objectives.POLICY_LOSSES))
def test_every_policy_loss_trains_the_adapters(qwen2, policy_loss):
  cfg, params = qwen2
  lc = worker.learner_config(lora=LORA, learning_rate=1e-2, policy_loss=policy_loss)
  state = learner.init_state(cfg, lc, params, _mesh())  # a copy: the update donates it
  fn = learner.make_logprob_fn(cfg, lc)
  update = learner.make_update_fn(cfg, lc, _mesh())
  batch = _batch(cfg, 0, old_from=params, lc=lc)
  mask = np.asarray(learner.loss_mask(batch, lc))
  adv = np.asarray(batch.advantages)[:, None]
  before = float((np.asarray(fn(params, batch)) * mask * adv).sum())
  for _ in range(3):
    state, m = update(state, batch)
    assert np.isfinite(float(m["loss"])), policy_loss
  after = float((np.asarray(fn(learner.policy_params(state), batch)) * mask * adv).sum())
  assert after > before, (policy_loss, before, after)  # advantage-weighted log-lik up


def test_exported_adapter_continues_training_from_where_it_was(qwen2, tmp_path):
  """export_adapter writes the PEFT directory (tests/model/test_peft_export.py: PEFT loads it);
  lora.init_from starts a state from it with the same adapters; a mismatched rank is
  named."""
  from rlvr.run import checkpoint

  cfg, params = qwen2
  lc = worker.learner_config(lora=LORA, learning_rate=1e-2)
  state = learner.init_state(cfg, lc, params, _mesh())
  update = learner.make_update_fn(cfg, lc, _mesh())
  for step in range(2):
    state, _ = update(state, _batch(cfg, step, old_from=learner.policy_params(state), lc=lc))
  out = checkpoint.export_adapter(str(tmp_path / "adapter"), cfg, state)
  assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors"]
  full = learner.TrainState(params=params, opt_state=None, step=0, rng=None)
  assert checkpoint.export_adapter(str(tmp_path / "none"), cfg, full) is None
  again = dataclasses.replace(lc, lora=dataclasses.replace(LORA, init_from=out))
  resumed = learner.init_state(cfg, again, params, _mesh())
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
    resumed.params,
    state.params,
  )
  assert int(resumed.step) == 0  # a new run from those adapters, fresh optimizer
  wrong = dataclasses.replace(lc, lora=dataclasses.replace(LORA, rank=8, init_from=out))
  with pytest.raises(ValueError, match="lora.init_from: .* has rank 4, lora.rank is 8"):
    learner.init_state(cfg, wrong, params, _mesh())
