"""Gradients accumulated inside the layer scan's backward pass (`model.grad_accum`,
`LearnerConfig.accumulate_in_backward`) and MoE token chunks: the same numbers as the plain
paths, and the memory they save, as the compiler plans it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr import learner, model
from rlvr.model import grad_accum, moe
from rlvr.parallel import sharding
from rlvr.run import checkpoint


def test_scan_returns_the_sum_plus_the_gradient():
  """jax.grad through grad_accum.scan returns acc + the gradient lax.scan gives, with a
  per-layer float output in the loss and an integer one beside it."""
  r = np.random.RandomState(0)
  layers, d = 5, 4
  params = {"w": jnp.asarray(r.randn(layers, d, d) * 0.3), "b": jnp.asarray(r.randn(layers, d))}
  x0 = jnp.asarray(r.randn(3, d), jnp.float32)
  scale = jnp.arange(layers, dtype=jnp.float32)

  def fn(p, h, s, c):
    h = jnp.tanh(h @ p["w"] + p["b"] * s * c)
    return h, (jnp.sum(h**2), jnp.argmax(h, -1))

  def loss(x, ys):
    return jnp.sum(jnp.cos(x)) + jnp.sum(ys[0])

  def plain(params, x0):
    x, ys = jax.lax.scan(lambda h, a: fn(a[0], h, a[1], 2.0), x0, (params, scale))
    return loss(x, ys)

  acc = jax.tree.map(lambda a: jnp.asarray(r.randn(*a.shape), jnp.float32), params)

  def fused(params, x0):
    return loss(*grad_accum.scan(fn, params, acc, x0, scale, 2.0))

  assert float(fused(params, x0)) == float(plain(params, x0))
  (g_p, g_x), (f_p, f_x) = (jax.grad(f, argnums=(0, 1))(params, x0) for f in (plain, fused))
  np.testing.assert_allclose(np.asarray(f_x), np.asarray(g_x), rtol=1e-6, atol=1e-7)
  for k in params:  # the backward adds acc in before the layers' terms are summed: f32 order
    assert float(jnp.abs(g_p[k]).max()) > 1e-2
    np.testing.assert_allclose(
      np.asarray(f_p[k]), np.asarray(acc[k] + g_p[k]), rtol=1e-5, atol=1e-6, err_msg=k
    )


def test_moe_token_chunks_equal_one_pass():
  r = np.random.RandomState(1)
  n, e, k, d, f = 23, 5, 2, 8, 6
  x = jnp.asarray(r.randn(n, d), jnp.float32)
  experts = jnp.asarray(np.argsort(r.rand(n, e), axis=1)[:, :k], jnp.int32)
  mix = jnp.asarray(r.rand(n, k), jnp.float32)
  w = (
    jnp.asarray(r.randn(e, d, f), jnp.float32),
    jnp.asarray(r.randn(e, d, f), jnp.float32),
    jnp.asarray(r.randn(e, f, d), jnp.float32),
  )

  def loss(chunk, x, *w):
    return jnp.sum(jnp.sin(moe.local_expert_ffn(x, experts, mix, *w, chunk=chunk)))

  for chunk in (7, 12):  # 4 chunks of 6 (one padding row), 2 of 12
    want, got = (moe.local_expert_ffn(x, experts, mix, *w, chunk=c) for c in (n, chunk))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    grads = [jax.grad(loss, argnums=(1, 2, 3, 4))(c, x, *w) for c in (n, chunk)]
    for a, b in zip(*grads):
      assert float(jnp.abs(b).max()) > 1e-2
      # Chunks are matmuls of other shapes, which some CPUs (AMD EPYC) sum in another f32
      # order: up to 2e-4 apart on gradients of size ~10; a wrong chunking is off by O(1).
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
  "field, value", [("scan_layers", False), ("remat_policy", "dots"), ("lora", "rank 4")]
)
def test_accumulating_in_backward_refuses_what_it_cannot_do(field, value):
  from rlvr.model.lora import LoraConfig

  value = LoraConfig(rank=4) if field == "lora" else value
  with pytest.raises(ValueError, match=f"accumulate_in_backward: .*{field.split('_')[0]}"):
    learner.LearnerConfig(accumulate_in_backward=True, **{field: value})


def _batch(vocab: int):
  import learner_worker as worker

  return {k: jnp.asarray(v) for k, v in worker.make_batch(0, vocab).items()}


@pytest.fixture(scope="module")
def policies(tmp_path_factory, tiny_dirs):
  from test_moe import MOE_CONFIGS  # dense layers among sparse ones, GQA, raw top-k

  root = tmp_path_factory.mktemp("accum")
  mixed = model.make_tiny(
    str(root / "mixed"), seed=4, init_std=0.1, family="qwen3_moe", **MOE_CONFIGS["mixed"]
  )
  return {"dense": model.load_hf(tiny_dirs["qwen2"]), "moe": model.load_hf(mixed)}


@pytest.mark.parametrize("name, mesh_axes", [("dense", {}), ("moe", {"fsdp": 2, "expert": 2})])
def test_update_accumulating_in_backward_equals_the_plain_update(policies, name, mesh_axes):
  """Two micro-batches, remat, router losses and routing replay on: the step's weights and
  metrics are the plain accumulation's."""
  import learner_worker as worker

  cfg, params = policies[name]
  host = _batch(cfg.vocab_size)
  if cfg.is_moe:  # replay the policy's own routes but one token's, so the loss sees them
    _, routing = model.forward(
      params, host["tokens_bt"], config=cfg, segment_ids=host["segment_bt"], return_routing=True
    )
    routes = jnp.moveaxis(routing.experts, 0, 2)
    host["routes_bt"] = routes.at[0, 20].set(jnp.roll(routes[0, 20], 1, axis=-1) % 6)
  mesh = sharding.make_mesh(mesh_axes, jax.devices()[: int(np.prod(list(mesh_axes.values())))])

  def step(fused: bool):
    lc = worker.learner_config(
      micro_batches=2,
      remat=True,
      accumulate_in_backward=fused,
      moe_aux_loss_coef=0.01 if cfg.is_moe else 0.0,
      moe_z_loss_coef=0.001 if cfg.is_moe else 0.0,
      routing_replay=cfg.is_moe,
    )
    state = learner.init_state(cfg, lc, params, mesh)
    batch = learner.TrainBatch(
      **{k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in host.items()}
    )
    state, metrics = learner.make_update_fn(cfg, lc, mesh)(state, batch)
    return jax.tree.map(np.asarray, state.params), jax.tree.map(float, metrics)

  (p_plain, m_plain), (p_fused, m_fused) = step(False), step(True)
  assert m_plain["grad_norm"] > 0
  assert m_fused.keys() == m_plain.keys()
  for key, value in m_plain.items():
    np.testing.assert_allclose(m_fused[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(p_fused), jax.tree.leaves(p_plain)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), p_fused, params)
  assert min(jax.tree.leaves(moved)) > 0  # every weight took a step


def test_accumulating_in_backward_saves_a_gradient_in_the_plan():
  """As compiled for 4 fake devices (fsdp), the update's temporaries shrink by about one
  gradient of the layer stacks: the micro-batch's own is never whole."""
  cfg = model.ModelConfig(
    family="qwen3_moe",
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    num_experts=16,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    norm_topk_prob=True,
  )
  mesh = sharding.make_mesh({"fsdp": 4}, jax.devices()[:4])
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
  rows, t = 8, 32
  batch = learner.TrainBatch(
    tokens_bt=spec((rows, t), jnp.int32),
    segment_bt=spec((rows, t), jnp.int32),
    loss_mask_bt=spec((rows, t), jnp.float32),
    advantages=spec((rows,), jnp.float32),
  )

  def temps(fused: bool) -> int:
    lc = learner.LearnerConfig(micro_batches=2, remat=True, accumulate_in_backward=fused)
    state = checkpoint.abstract_state(cfg, lc, mesh)
    step = learner.jit_train_step(cfg, lc, mesh, batch).lower(state, batch).compile()
    return step.memory_analysis().temp_size_in_bytes

  shapes = model.param_shapes(cfg)
  stack = sum(a.size * 4 for a in jax.tree.leaves(shapes["layers"])) // 4  # per device
  saved = temps(False) - temps(True)
  assert saved > 0.8 * stack, (saved, stack)
