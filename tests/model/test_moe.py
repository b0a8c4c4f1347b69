"""Qwen3-MoE: logits and gradients vs transformers, HF round trip, routing replay, and
expert-parallel forward / gradient on fake CPU devices equal to one device."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P
from transformers import AutoModelForCausalLM

from rlvr import model
from rlvr.model import hf_io, moe, safetensors_io
from rlvr.parallel import sharding

# Two odd shapes: every layer sparse (one "layers" stack, tied, normalised top-k), and
# dense layers among sparse ones (three stacks, untied, raw top-k probabilities, GQA 4:1).
MOE_CONFIGS = {
  "all_sparse": dict(
    num_layers=2,
    hidden_size=48,
    intermediate_size=72,
    num_heads=3,
    num_kv_heads=1,
    num_experts=5,
    num_experts_per_tok=2,
    moe_intermediate_size=40,
    norm_topk_prob=True,
    tie_word_embeddings=True,
  ),
  "mixed": dict(
    num_layers=4,
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    num_kv_heads=1,
    num_experts=6,
    num_experts_per_tok=3,
    moe_intermediate_size=24,
    norm_topk_prob=False,
    mlp_only_layers=[2],
    tie_word_embeddings=False,
    router_aux_loss_coef=0.01,
  ),
}


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("moe")
  return {
    name: model.make_tiny(str(root / name), seed=7 + i, init_std=0.1, family="qwen3_moe", **kw)
    for i, (name, kw) in enumerate(MOE_CONFIGS.items())
  }


def _tokens(shape, seed=0):
  return np.random.RandomState(seed).randint(3, 700, shape).astype(np.int32)


def _torch_model(path):
  return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_logits_match_transformers(moe_dirs, name):
  cfg, params = model.load_hf(moe_dirs[name])
  assert cfg.num_sparse_layers == (2 if name == "all_sparse" else 3)
  tokens = _tokens((2, 37))
  mask = np.ones_like(tokens)
  mask[1, 29:] = 0  # right padding in one row
  tokens = np.where(mask == 1, tokens, 0)
  with torch.no_grad():
    ref = _torch_model(moe_dirs[name])(torch.tensor(tokens), attention_mask=torch.tensor(mask))
  ref = ref.logits.numpy()
  forward = jax.jit(model.forward, static_argnames=("config", "scan_layers"))
  ours = forward(params, jnp.asarray(tokens), config=cfg, segment_ids=jnp.asarray(mask))
  real = mask == 1
  np.testing.assert_allclose(np.asarray(ours)[real], ref[real], atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 1.0
  unrolled = forward(
    params, jnp.asarray(tokens), config=cfg, segment_ids=jnp.asarray(mask), scan_layers=False
  )
  np.testing.assert_allclose(np.asarray(unrolled), np.asarray(ours), atol=1e-5, rtol=0)


def _torch_grads(tm, cfg):
  """HF-named gradients, the fused expert tensors split per expert as on disk."""
  f = cfg.moe_intermediate_size
  out = {}
  for key, p in tm.named_parameters():
    g = p.grad.numpy()
    if key.endswith("mlp.experts.gate_up_proj"):
      base = key[: -len("gate_up_proj")]
      for e in range(g.shape[0]):
        out[f"{base}{e}.gate_proj.weight"] = g[e, :f]
        out[f"{base}{e}.up_proj.weight"] = g[e, f:]
    elif key.endswith("mlp.experts.down_proj"):
      base = key[: -len("down_proj")]
      for e in range(g.shape[0]):
        out[f"{base}{e}.down_proj.weight"] = g[e]
    else:
      out[key] = g
  return out


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_gradients_match_torch_autograd(moe_dirs, name):
  cfg, params = model.load_hf(moe_dirs[name])
  tokens = _tokens((2, 19), seed=1)
  probe = np.random.RandomState(2).randn(2, 19, cfg.vocab_size).astype(np.float32)

  def loss(p):
    return jnp.sum(model.forward(p, jnp.asarray(tokens), config=cfg) * probe)

  grads = jax.jit(jax.grad(loss))(params)
  tm = _torch_model(moe_dirs[name])
  (tm(torch.tensor(tokens)).logits * torch.tensor(probe)).sum().backward()
  theirs = _torch_grads(tm, cfg)
  ours = dict(hf_io.hf_tensors(cfg, grads))
  assert set(ours) == set(theirs)
  scale = max(np.abs(g).max() for g in theirs.values())
  for key, g in ours.items():
    np.testing.assert_allclose(g, theirs[key], atol=1e-4 * scale, rtol=0, err_msg=key)
  router = [g for k, g in ours.items() if k.endswith("mlp.gate.weight")]
  assert len(router) == cfg.num_sparse_layers and all(np.abs(g).max() > 0 for g in router)


def test_save_hf_round_trip_writes_per_expert_tensors(moe_dirs, tmp_path):
  cfg, params = model.load_hf(moe_dirs["mixed"])
  assert cfg.mlp_only_layers == (2,) and cfg.router_aux_loss_coef == 0.01
  assert [g.name for g in model.layer_groups(cfg)] == ["layers_0", "layers_2", "layers_3"]
  params = jax.tree.map(lambda p: p + 0.01 * jnp.sin(jnp.arange(p.size).reshape(p.shape)), params)
  out = model.save_hf(str(tmp_path / "copy"), cfg, params)
  cfg2, params2 = model.load_hf(out)
  assert cfg2 == cfg
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), params, params2
  )
  keys = set(safetensors_io.SafetensorsFile(os.path.join(out, "model.safetensors")).keys())
  e, f, d = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
  assert {f"model.layers.3.mlp.experts.{i}.down_proj.weight" for i in range(e)} <= keys
  assert (
    "model.layers.2.mlp.gate_proj.weight" in keys and "model.layers.2.mlp.gate.weight" not in keys
  )
  # Expert 1 of layer 3 (stack layers_3, index 0) is HF's [out, in] transpose of ours.
  w = safetensors_io.SafetensorsFile(os.path.join(out, "model.safetensors"))
  up = w.get("model.layers.3.mlp.experts.1.up_proj.weight")
  assert up.shape == (f, d)
  np.testing.assert_array_equal(up, np.asarray(params["layers_3"]["moe"]["up_kernel"][0, 1]).T)
  hf = json.load(open(os.path.join(out, "config.json")))
  assert hf["architectures"] == ["Qwen3MoeForCausalLM"] and hf["mlp_only_layers"] == [2]


def test_routing_replay_uses_the_given_experts(moe_dirs):
  cfg, params = model.load_hf(moe_dirs["all_sparse"])
  tokens = jnp.asarray(_tokens((2, 11), seed=3))
  logits, routing = model.forward(params, tokens, config=cfg, return_routing=True)
  s, k, e = cfg.num_sparse_layers, cfg.num_experts_per_tok, cfg.num_experts
  assert routing.logits.shape == (s, 2, 11, e) and routing.experts.shape == (s, 2, 11, k)
  top = jax.lax.top_k(routing.logits, k)[1]
  np.testing.assert_array_equal(np.asarray(routing.experts), np.asarray(top))
  replayed = model.forward(params, tokens, config=cfg, routes=routing.experts)
  np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits))
  other = (routing.experts + 1) % e  # still k distinct experts per token
  moved, routing2 = model.forward(params, tokens, config=cfg, routes=other, return_routing=True)
  np.testing.assert_array_equal(np.asarray(routing2.experts), np.asarray(other))
  assert float(jnp.abs(moved - logits).max()) > 1e-3

  def loss(p):
    return jnp.sum(model.forward(p, tokens, config=cfg, routes=other) ** 2)

  router_grad = jax.grad(loss)(params)["layers"]["moe"]["router_kernel"]
  assert float(jnp.abs(router_grad).max()) > 0


def test_dense_model_returns_empty_routing():
  cfg = model.ModelConfig(
    family="qwen3",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
  )
  params = model.init(cfg, jax.random.key(0))
  tokens = jnp.asarray(_tokens((2, 5), seed=4) % 64)
  logits, routing = model.forward(params, tokens, config=cfg, return_routing=True)
  assert routing.logits.shape == (0, 2, 5, 0) and routing.experts.shape == (0, 2, 5, 0)
  np.testing.assert_array_equal(
    np.asarray(logits), np.asarray(model.forward(params, tokens, config=cfg))
  )


def _forward_and_grads(cfg, params, mesh, rows=4):
  """Logits and the gradient of a fixed probe of them, computed on `mesh`."""
  tokens = _tokens((rows, 13), seed=5)
  seg = np.ones_like(tokens)
  seg[0, :3] = 0
  probe = np.random.RandomState(6).randn(rows, 13, cfg.vocab_size).astype(np.float32)
  placed = jax.device_put(params, model.param_shardings(cfg, mesh))
  rows_sh = jax.sharding.NamedSharding(mesh, P(sharding.data_axes(mesh, rows) or None))
  tok, sg = (jax.device_put(jnp.asarray(a), rows_sh) for a in (tokens, seg))

  def loss(p, tok, sg):
    logits = model.forward(p, tok, config=cfg, segment_ids=sg, mesh=mesh)
    return jnp.sum(logits * probe), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(placed, tok, sg)
  return np.asarray(logits), jax.tree.map(np.asarray, grads)


@pytest.fixture(scope="module")
def one_device(moe_dirs):
  cfg, params = model.load_hf(moe_dirs["mixed"])
  return cfg, params, _forward_and_grads(cfg, params, sharding.make_mesh({}, jax.devices()[:1]))


@pytest.mark.parametrize(
  "mesh_axes",
  [
    {"expert": 2},  # rows split over the expert axis: gathered, computed, scattered back
    {"fsdp": 2, "expert": 2},
    {"fsdp": 4, "expert": 2},  # 4 rows over fsdp only: partial sums added over experts
  ],
)
def test_expert_parallel_equals_one_device(one_device, mesh_axes):
  cfg, params, (logits1, grads1) = one_device
  mesh = sharding.make_mesh(mesh_axes, jax.devices()[: int(np.prod(list(mesh_axes.values())))])
  gate = params["layers_0"]["moe"]["gate_kernel"]
  held = model.param_shardings(cfg, mesh)["layers_0"]["moe"]["gate_kernel"]
  assert held.shard_shape(gate.shape)[1] == cfg.num_experts // 2  # experts split over devices
  logits, grads = _forward_and_grads(cfg, params, mesh)
  np.testing.assert_allclose(logits, logits1, atol=1e-5, rtol=0)
  assert np.abs(logits1).max() > 1.0
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads1)):
    tol = 1e-5 * np.abs(b).max() + 1e-7
    np.testing.assert_allclose(a, b, atol=tol, err_msg=jax.tree_util.keystr(path))


def test_tiled_grouped_matmul_equals_ragged_dot():
  r = np.random.RandomState(8)
  e, d, f = 5, 8, 6
  xs = jnp.asarray(r.randn(50, d), jnp.float32)
  gate, up = (jnp.asarray(r.randn(e, d, f), jnp.float32) for _ in range(2))
  down = jnp.asarray(r.randn(e, f, d), jnp.float32)
  sizes = jnp.asarray([7, 0, 13, 3, 9], jnp.int32)  # an empty group, 18 rows past them all
  want = moe.swiglu_ragged(xs, sizes, gate, up, down)
  assert float(jnp.abs(want[32:]).max()) == 0.0
  for tile in (1, 4, 128):
    got = moe.swiglu_tiles(xs, sizes, gate, up, down, tile=tile)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-5)

  def loss(grouped, *w):
    return jnp.sum(jnp.sin(moe.local_expert_ffn(xs[:20], experts, mix, *w, grouped=grouped)))

  experts = jnp.asarray(np.argsort(r.rand(20, e), axis=1)[:, :2], jnp.int32)
  mix = jnp.asarray(r.rand(20, 2), jnp.float32)
  g_ragged = jax.grad(lambda *w: loss("ragged", *w), argnums=(0, 1, 2))(gate, up, down)
  g_tiles = jax.grad(lambda *w: loss("tiles", *w), argnums=(0, 1, 2))(gate, up, down)
  for a, b in zip(g_tiles, g_ragged):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * np.abs(b).max(), rtol=0)


def test_learner_update_on_an_expert_mesh_equals_one_device(one_device):
  """The learner's update of a MoE policy (its forward given the learner's mesh: experts
  run expert-parallel) on fsdp=2 x expert=2 equals one device's, and moves experts and
  router."""
  import learner_worker as worker

  from rlvr import learner

  cfg, params, _ = one_device
  lc = worker.learner_config()
  host = worker.make_batch(0, cfg.vocab_size)

  def step(mesh):
    state = learner.init_state(cfg, lc, params, mesh)
    batch = learner.TrainBatch(
      **{k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in host.items()}
    )
    state, metrics = learner.make_update_fn(cfg, lc, mesh)(state, batch)
    return jax.tree.map(np.asarray, state.params), float(metrics["loss"])

  one, loss1 = step(sharding.make_mesh({}, jax.devices()[:1]))
  many, loss4 = step(sharding.make_mesh({"fsdp": 2, "expert": 2}, jax.devices()[:4]))
  np.testing.assert_allclose(loss4, loss1, rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(many), jax.tree.leaves(one)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  moe0 = params["layers_0"]["moe"]
  for name in ("router_kernel", "gate_kernel", "down_kernel"):
    assert np.abs(one["layers_0"]["moe"][name] - np.asarray(moe0[name])).max() > 1e-5, name


def _routing_reference(cfg, params, host):
  """Routing statistics and router losses by their definitions, in numpy, over the batch's
  loss tokens (completion tokens of real rows)."""
  _, routing = model.forward(
    params,
    jnp.asarray(host["tokens_bt"]),
    config=cfg,
    segment_ids=jnp.asarray(host["segment_bt"]),
    return_routing=True,
  )
  logits = np.asarray(routing.logits, np.float64)  # [S, B, T, E]
  experts = np.asarray(routing.experts)  # [S, B, T, k]
  mask = (host["loss_mask_bt"] > 0) & (host["segment_bt"] > 0)
  lg, ex = logits[:, mask], experts[:, mask]  # [S, N, E], [S, N, k]
  s, n, e = lg.shape
  probs = np.exp(lg - lg.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  load = np.stack([np.bincount(ex[i].ravel(), minlength=e) for i in range(s)])  # [S, E]
  f = np.stack([(ex[:, :, j, None] == np.arange(e)).mean((0, 1)) for j in range(ex.shape[-1])])
  lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  return {
    "expert_load_max_mean": np.mean(load.max(1) / load.mean(1)),
    "router_entropy": -np.sum(probs * np.log(probs), -1).mean(),
    "moe_aux_loss": e * np.sum(f * probs.reshape(-1, e).mean(0)[None]),
    "moe_z_loss": np.mean(lse**2),
  }


def test_router_metrics_and_losses_equal_their_definitions(one_device):
  """Per-step routing health and the (optional) load-balancing and z-losses, from the
  learner's update, equal numpy's on the same routing; each loss enters the step's loss
  with its coefficient, and off by default."""
  import learner_worker as worker

  from rlvr import learner

  cfg, params, _ = one_device
  host = worker.make_batch(0, cfg.vocab_size)
  mesh = sharding.make_mesh({}, jax.devices()[:1])
  want = _routing_reference(cfg, params, host)

  batch = learner.TrainBatch(**{k: jnp.asarray(v) for k, v in host.items()})

  def update(**kw):
    lc = worker.learner_config(**kw)
    return learner.make_update_fn(cfg, lc, mesh), learner.init_state(cfg, lc, params, mesh)

  def metrics(**kw):
    fn, state = update(**kw)
    return {k: float(v) for k, v in fn(state, batch)[1].items()}

  off = jax.eval_shape(*update(), batch)[1]  # the default update's metrics, as traced
  assert "moe_aux_loss" not in off and "moe_z_loss" not in off
  assert "router_entropy" in off and "expert_load_max_mean" in off
  on = metrics(moe_aux_loss_coef=0.5, moe_z_loss_coef=0.25)
  for k in ("expert_load_max_mean", "router_entropy", "moe_aux_loss", "moe_z_loss"):
    np.testing.assert_allclose(on[k], want[k], rtol=1e-5, err_msg=k)
  assert 1 <= on["expert_load_max_mean"] <= on["expert_load_max_mean_worst"]
  # The step's loss is the policy loss plus each router loss times its coefficient.
  added = 0.5 * want["moe_aux_loss"] + 0.25 * want["moe_z_loss"]
  np.testing.assert_allclose(on["loss"] - on["pg_loss"], added, rtol=1e-4)
  # The same with the batch in two micro-batches (each loss a mean over its micro-batch).
  two = metrics(moe_aux_loss_coef=0.5, moe_z_loss_coef=0.25, micro_batches=2)
  np.testing.assert_allclose(two["router_entropy"], want["router_entropy"], rtol=1e-5)


@pytest.mark.slow
def test_vllm_cpu_serves_the_moe_policy_and_takes_its_weight_updates(moe_dirs, tmp_path):
  """The real vLLM CPU server samples the exported MoE policy (dense layers among sparse
  ones) with log-probs equal to `model.forward`'s, and after each weight update, from disk
  and by transfer, with the new policy's: its CPU experts pad and prepack their weights at
  load, and the repo's vLLM plugin repacks them on every in-place update
  (plugins/rlvr_vllm_transfer/rlvr_vllm_transfer/cpu_moe.py)."""
  from test_vllm_sampler import PROMPTS, _max_diff

  from rlvr.sampling import SamplingParams
  from rlvr.sampling.vllm_sampler import VLLMSampler
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  cfg, params = model.load_hf(moe_dirs["mixed"])
  server = start_server(
    moe_dirs["mixed"],
    ServerOptions(max_model_len=256, weight_transfer="rlvr_tcp"),
    log_path=str(tmp_path / "vllm.log"),
  )
  kw = dict(model_config=cfg, eos_token_id=cfg.eos_token_id, sync_dir=str(tmp_path))
  samplers = [VLLMSampler(server.url, weight_sync=sync, **kw) for sync in ("disk", "transfer")]
  try:
    sp = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=1, ignore_eos=True)
    assert _max_diff(samplers[0].generate(PROMPTS, sp), PROMPTS, params, cfg) <= 1e-4
    for version, (sampler, scale) in enumerate(zip(samplers, (1.1, 0.9)), 1):
      new = jax.tree.map(lambda p, s=scale: p * s, params)
      sampler.update_weights(new, version=version)
      outs = sampler.generate(PROMPTS, sp)
      assert _max_diff(outs, PROMPTS, new, cfg) <= 1e-4, sampler.weight_sync
      assert _max_diff(outs, PROMPTS, params, cfg) > 1e-2  # not the old policy
  finally:
    for sampler in samplers:
      sampler.close()
    server.stop()


def test_routing_replay_from_the_jax_sampler(moe_dirs, one_device):
  """The JAX sampler returns the experts it routed each fed token to (prompt and
  completion; -1 for the last token, never fed), equal to a full forward's; the learner
  at other weights routes some tokens elsewhere (routing_mismatch > 0), and with
  rl.learner.routing_replay it uses the sampler's experts: the mismatch is 0."""
  from transformers import AutoTokenizer

  from rlvr import learner, rollout
  from rlvr.learner import packing
  from rlvr.sampling import JaxSampler, SamplingParams

  cfg, params, _ = one_device
  tok = AutoTokenizer.from_pretrained(moe_dirs["mixed"])
  sampler = JaxSampler(cfg, params, tok)
  prompts = [[5, 6, 7, 8], [30, 31], [200, 201, 202]]
  outs = sampler.generate(prompts, SamplingParams(n=2, max_tokens=6, seed=0, ignore_eos=True))
  s, k = cfg.num_sparse_layers, cfg.num_experts_per_tok
  seqs = [list(p) + list(c.token_ids) for p, group in zip(prompts, outs) for c in group]
  # One full forward of all sequences, right-padded: causal attention and dropless routing
  # leave each sequence's own tokens as they are alone.
  width = max(map(len, seqs))
  padded = jnp.asarray([seq + [0] * (width - len(seq)) for seq in seqs])
  fwd = jax.jit(lambda p, t: model.forward(p, t, config=cfg, return_routing=True)[1].experts)
  full_all = np.asarray(fwd(params, padded))  # [S, N, T, k]
  completions = [c for group in outs for c in group]
  for i, (seq, c) in enumerate(zip(seqs, completions)):
    assert c.routes.shape == (len(seq), s, k) and (c.routes[-1] == -1).all()
    full = np.swapaxes(full_all[:, i, : len(seq)], 0, 1)  # [T, S, k]
    np.testing.assert_array_equal(np.sort(c.routes[:-1], -1), np.sort(full[:-1], -1))
  rl = rollout.RLConfig(prompts_per_step=3, group_size=2, max_prompt_len=8, max_response_len=8)
  groups = [
    rollout.Group(
      rollout.Prompt(tuple(p), "0"), g, np.array([0.0, 1.0], np.float32), np.ones(2, bool)
    )
    for p, g in zip(prompts, outs)
  ]
  arrays = packing.build_batch(groups, learner.LearnerConfig(), rl.batch_shape, tok.pad_token_id)
  assert arrays["routes_bt"].shape[2:] == (s, k)
  batch = learner.TrainBatch(**{k_: jnp.asarray(v) for k_, v in arrays.items()})
  mesh = sharding.make_mesh({}, jax.devices()[:1])
  # The learner holds other router weights than the sampler sampled with.
  moved = jax.tree_util.tree_map_with_path(
    lambda path, x: x * 1.5 if "router" in jax.tree_util.keystr(path) else x, params
  )
  mismatch = {}
  for replay in (False, True):
    lc = learner.LearnerConfig(learning_rate=1e-3, routing_replay=replay)
    state = learner.init_state(cfg, lc, moved, mesh)
    _, m = learner.make_update_fn(cfg, lc, mesh)(state, batch)
    mismatch[replay] = float(m["routing_mismatch"])
  assert mismatch[False] > 0.01 and mismatch[True] == 0.0
