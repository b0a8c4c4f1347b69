"""LoRA (rlvr.model.lora): fresh adapters are a no-op, the merge is the unmerged LoRA
layer of transformers' model, training moves only the adapters, and the merged
export (and an SFT run, resumed) loads in transformers."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import learner_worker as worker
import numpy as np
import pytest
import torch
from flax import traverse_util
from test_model import _tokens, _torch_logits
from transformers import AutoModelForCausalLM

from rlvr import learner, model
from rlvr.common import settings
from rlvr.learner import state as learner_state
from rlvr.model import lora
from rlvr.model.lora import LoraConfig
from rlvr.parallel import sharding
from rlvr.run import checkpoint

HF_MODULE = {
  "q_kernel": "self_attn.q_proj",
  "k_kernel": "self_attn.k_proj",
  "v_kernel": "self_attn.v_proj",
  "o_kernel": "self_attn.o_proj",
  "gate_kernel": "mlp.gate_proj",
  "up_kernel": "mlp.up_proj",
  "down_kernel": "mlp.down_proj",
}


def _random_adapters(params, cfg, seed=1, b_std=0.05):
  """Adapters with both A and B non-zero (fresh ones have B = 0)."""
  ad = lora.init_adapters(params, cfg, jax.random.key(seed))
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
    lambda p, x: (
      jnp.asarray(rng.randn(*x.shape).astype(np.float32) * b_std) if p[-1].key == "lora_b" else x
    ),
    ad,
  )


def test_bad_config_names_the_field():
  for kw, field in [
    (dict(rank=-1), "rank"),
    (dict(alpha=0.0), "alpha"),
    (dict(dropout=1.0), "dropout"),
    (dict(targets="q_kernel"), "targets"),
    (dict(targets=("q_proj",)), "targets"),
    (dict(targets=()), "targets"),
  ]:
    with pytest.raises(ValueError, match=field):
      LoraConfig(**kw)
  with pytest.raises(ValueError, match="lora"):
    learner.LearnerConfig(lora={"rank": 4})
  # A section nests the dataclass field and freezes back into it.
  sec = settings.section(learner.LearnerConfig, lora=LoraConfig(rank=32))
  sec.lora.dropout = 0.1
  lc = settings.frozen(learner.LearnerConfig, sec)
  assert lc.lora == LoraConfig(rank=32, dropout=0.1) and lc.lora.scale == 2.0
  assert (
    settings.frozen(learner.LearnerConfig, settings.section(learner.LearnerConfig))
    == learner.LearnerConfig()
  )


def test_a_target_the_model_lacks_is_named(tiny_dirs):
  _, params = model.load_hf(tiny_dirs["qwen2"])  # tied: no lm_head
  with pytest.raises(ValueError, match="targets: 'lm_head'"):
    lora.init_adapters(params, LoraConfig(rank=2, targets=("lm_head",)), jax.random.key(0))


def test_fresh_adapters_leave_the_model_unchanged(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["llama"])
  lc = LoraConfig(rank=8, dropout=0.1)
  ad = lora.init_adapters(params, lc, jax.random.key(0))
  attn = ad["layers"]["attn"]
  # [layers, *in, r] and [layers, r, *out]; o_kernel's input is (heads, head_dim).
  assert attn["q_kernel"]["lora_a"].shape == (3, 128, 8)
  assert attn["q_kernel"]["lora_b"].shape == (3, 8, 4, 32)
  assert attn["o_kernel"]["lora_a"].shape == (3, 4, 32, 8)
  assert attn["o_kernel"]["lora_b"].shape == (3, 8, 128)
  assert set(traverse_util.flatten_dict(ad)) == {
    ("layers", m, k, ab)
    for m, ks in (("attn", "qkvo"), ("mlp", ("gate", "up", "down")))
    for k in (f"{x}_kernel" for x in ks)
    for ab in ("lora_a", "lora_b")
  }
  assert all(float(jnp.abs(x["lora_a"]).min()) > 0 for x in attn.values())
  merged = lora.merge(params, ad, lc, dropout_rng=jax.random.key(3))
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), merged, params
  )
  tokens = jnp.asarray(_tokens((2, 24)))
  np.testing.assert_array_equal(
    np.asarray(model.forward(merged, tokens, config=cfg)),
    np.asarray(model.forward(params, tokens, config=cfg)),
  )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_merged_model_equals_unmerged_lora_layers_in_transformers(tiny_dirs, family):
  """Reference: transformers' model with every targeted nn.Linear computing
  x W^T + s (x A) B via forward hooks (no merge, no reshape of W)."""
  cfg, params = model.load_hf(tiny_dirs[family])
  targets = lora.ALL_LINEAR + (("lm_head",) if family == "llama" else ())
  lc = LoraConfig(rank=4, alpha=8.0, targets=targets)
  ad = _random_adapters(params, lc)
  tokens = _tokens((2, 40), seed=7)
  ours = np.asarray(model.forward(lora.merge(params, ad, lc), jnp.asarray(tokens), config=cfg))

  tm = AutoModelForCausalLM.from_pretrained(tiny_dirs[family], dtype=torch.float32).eval()
  flat = traverse_util.flatten_dict(jax.tree.map(np.asarray, ad))

  def hook(a, b):
    a, b = torch.tensor(a.reshape(-1, lc.rank)), torch.tensor(b.reshape(lc.rank, -1))
    return lambda mod, inp, out: out + lc.scale * (inp[0] @ a) @ b

  for (*path, name, ab), a in flat.items():
    if ab != "lora_a":
      continue
    b = flat[(*path, name, "lora_b")]
    if name == "lm_head":
      tm.lm_head.register_forward_hook(hook(a, b))
      continue
    for i, layer in enumerate(tm.model.layers):
      layer.get_submodule(HF_MODULE[name]).register_forward_hook(hook(a[i], b[i]))
  with torch.no_grad():
    ref = tm(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  # The adapters matter: far more than the tolerance.
  assert np.abs(ours - _torch_logits(tiny_dirs[family], tokens)).max() > 0.1


def test_merge_equals_a_numpy_loop_over_layers(tiny_dirs):
  """Every adaptable kernel ("*": embedding and lm_head too), merged layer by layer in f64."""
  cfg, params = model.load_hf(tiny_dirs["llama"])
  lc = LoraConfig(rank=3, alpha=6.0, targets=("*",))
  ad = _random_adapters(params, lc, seed=2)
  flat_p = traverse_util.flatten_dict(jax.tree.map(np.asarray, params))
  flat_a = traverse_util.flatten_dict(jax.tree.map(np.asarray, ad))
  want = dict(flat_p)
  kernels = {p[:-1] for p in flat_a}
  assert {k[-1] for k in kernels} == set(lora.IN_DIMS)
  for path in kernels:
    w, a, b = flat_p[path], flat_a[path + ("lora_a",)], flat_a[path + ("lora_b",)]
    n_in = lora.IN_DIMS[path[-1]]
    per_layer = (
      [(w[i], a[i], b[i]) for i in range(cfg.num_layers)] if path[0] == "layers" else [(w, a, b)]
    )
    out = []
    for wl, al, bl in per_layer:
      din = int(np.prod(wl.shape[:n_in]))
      d = al.astype(np.float64).reshape(din, -1) @ bl.astype(np.float64).reshape(lc.rank, -1)
      out.append((wl + 2.0 * d.reshape(wl.shape)).astype(np.float32))
    want[path] = np.stack(out) if path[0] == "layers" else out[0]
  merged = traverse_util.flatten_dict(lora.merge(params, ad, lc))
  for path in flat_p:
    np.testing.assert_allclose(
      np.asarray(merged[path]), want[path], rtol=0, atol=1e-6, err_msg=str(path)
    )
  tokens = jnp.asarray(_tokens((2, 24), seed=3))
  got = np.asarray(model.forward(traverse_util.unflatten_dict(merged), tokens, config=cfg))
  ref = np.asarray(model.forward(traverse_util.unflatten_dict(want), tokens, config=cfg))
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
  assert np.abs(got - np.asarray(model.forward(params, tokens, config=cfg))).max() > 0.1


def test_dropout_drops_input_rows_of_a(tiny_dirs):
  """Per step and layer, each input feature of the LoRA path is dropped (its row
  of the update 0) or kept and scaled by 1/(1-p); the base is never dropped."""
  _, params = model.load_hf(tiny_dirs["qwen2"])
  lc = LoraConfig(rank=3, alpha=6.0, dropout=0.5, targets=("q_kernel",))
  ad = _random_adapters(params, lc, seed=4)
  w = params["layers"]["attn"]["q_kernel"]
  full = np.asarray(lora.merge(params, ad, lc)["layers"]["attn"]["q_kernel"] - w)
  drop = np.asarray(lora.merge(params, ad, lc, jax.random.key(5))["layers"]["attn"]["q_kernel"] - w)
  again = lora.merge(params, ad, lc, jax.random.key(5))["layers"]["attn"]["q_kernel"]
  np.testing.assert_array_equal(np.asarray(again - w), drop)  # a key fixes the mask
  full, drop = full.reshape(2, 128, -1), drop.reshape(2, 128, -1)
  kept = np.abs(drop).max(-1) > 0
  np.testing.assert_allclose(drop[kept], 2 * full[kept], rtol=1e-4, atol=1e-6)
  assert 0.3 < kept.mean() < 0.7 and (kept[0] != kept[1]).any()  # independent per layer


# --------------------------------------------------------------------- training
LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.1)


def _train(cfg, params, lc, mesh, steps=3):
  state = learner.init_state(cfg, lc, params, mesh)
  update = learner.make_update_fn(cfg, lc, mesh)
  for s in range(steps):
    b = worker.make_batch(s, cfg.vocab_size)
    b["advantages"] = np.abs(b["advantages"]) + 0.5  # SFT-like: raise every completion
    state, _ = update(
      state,
      learner.TrainBatch(
        **{k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in b.items()}
      ),
    )
  return state


@pytest.fixture(scope="module")
def trained(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  lc = worker.learner_config(lora=LORA, learning_rate=1e-2)
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  return cfg, params, lc, _train(cfg, params, lc, mesh)


def test_training_moves_only_the_adapters(trained):
  cfg, params, lc, state = trained
  assert isinstance(state, learner.LoraTrainState) and int(state.step) == 3
  full = jax.eval_shape(
    lambda p: learner.new_state(p, jax.random.PRNGKey(0), learner.LearnerConfig()), params
  )
  assert type(full) is learner.TrainState  # full fine-tuning: the plain state, its checkpoints
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), state.base, params
  )  # base bit-identical
  fresh = lora.init_adapters(
    params, lc.lora, jax.random.fold_in(jax.random.PRNGKey(0), learner_state.LORA_INIT)
  )
  for (path, x), y in zip(
    jax.tree_util.tree_leaves_with_path(state.params), jax.tree.leaves(fresh)
  ):
    assert float(jnp.abs(x - y).max()) > 1e-4, jax.tree_util.keystr(path)  # A and B moved
  # The optimizer holds adapter-shaped moments only: mu and nu, one per adapter.
  adapter_shapes = sorted(x.shape for x in jax.tree.leaves(state.params))
  moments = sorted(x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
  assert moments == sorted(adapter_shapes * 2)
  n_adapter = sum(x.size for x in jax.tree.leaves(state.params))
  assert n_adapter < 0.1 * sum(x.size for x in jax.tree.leaves(params))
  # The merged policy learned: completion log-likelihood up on the training batches.
  fn = learner.make_logprob_fn(cfg, lc)
  batch = learner.TrainBatch(**worker.make_batch(0, cfg.vocab_size))
  mask = np.asarray(learner.loss_mask(batch, lc))
  before = float((np.asarray(fn(params, batch)) * mask).sum())
  after = float((np.asarray(fn(learner.policy_params(state), batch)) * mask).sum())
  assert after - before > 1.0, (before, after)


def test_sharded_micro_batched_lora_step_equals_single_device(trained):
  """The adapters shard like their kernels, and one dropout mask per step makes
  2 micro-batches on a 2x2 mesh take the single-device step."""
  cfg, params, lc, ref = trained
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 2}, jax.devices()[:4])
  lc2 = worker.learner_config(lora=LORA, learning_rate=1e-2, micro_batches=2)
  got = _train(cfg, params, lc2, mesh)
  q_a = got.params["layers"]["attn"]["q_kernel"]["lora_a"]
  assert q_a.sharding.shard_shape(q_a.shape) == (2, 64, 4)  # embed over fsdp
  q_b = got.params["layers"]["attn"]["q_kernel"]["lora_b"]
  assert q_b.sharding.shard_shape(q_b.shape) == (2, 4, 2, 32)  # heads over tensor
  for (path, x), y in zip(
    jax.tree_util.tree_leaves_with_path(got.params), jax.tree.leaves(ref.params)
  ):
    np.testing.assert_allclose(
      np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path)
    )


def test_merged_export_loads_in_transformers(trained, tmp_path):
  cfg, params, lc, state = trained
  out = checkpoint.export_hf(str(tmp_path / "merged"), cfg, state)
  tokens = _tokens((2, 33), seed=4)
  ours = np.asarray(model.forward(learner.policy_params(state), jnp.asarray(tokens), config=cfg))
  ref = _torch_logits(out, tokens)
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  base = np.asarray(model.forward(params, jnp.asarray(tokens), config=cfg))
  assert np.abs(ref - base).max() > 1e-2  # the export is not the base


def test_lora_sft_resumes_and_exports_merged(tiny_dirs, tmp_path, capsys):
  """train_sft with sft.learner.lora: a checkpoint mid-way (adapters + base), a
  rerun resumes from it to the same merged model, which transformers loads."""
  from rlvr.data.tasks import arithmetic
  from rlvr.run.sft import train_sft

  train, _ = arithmetic.make_splits(16, 0, max_operand=9)
  pairs = [(p.problem, p.solution) for p in train]
  lc = learner.LearnerConfig(learning_rate=1e-2, weight_decay=0.0, dual_clip=None, lora=LORA)
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  work = tmp_path / "sft"
  kw = dict(learner_cfg=lc, mesh=mesh, steps=4, batch_size=8, checkpoint_every=2, progress=False)
  out = train_sft(tiny_dirs["qwen2"], pairs, str(work), **kw)
  shutil.move(out, tmp_path / "first")
  assert checkpoint.manager(str(work / "checkpoints")).latest_step() == 2
  assert "resumed SFT" not in capsys.readouterr().out
  out = train_sft(tiny_dirs["qwen2"], pairs, str(work), **kw)  # resumes at step 2
  assert "resumed SFT from step 2\n" in capsys.readouterr().out
  rows = [json.loads(line) for line in open(work / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  _, first = model.load_hf(str(tmp_path / "first"))
  cfg, merged = model.load_hf(out)
  _, base = model.load_hf(tiny_dirs["qwen2"])
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), merged, first)
  # Only the adapted kernels differ from the base; embedding and norms are the base's.
  for path, x in traverse_util.flatten_dict(merged).items():
    y = traverse_util.flatten_dict(base)[path]
    if path[-1] in lora.ALL_LINEAR:
      assert float(jnp.abs(x - y).max()) > 1e-4, path
    else:
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))
  tokens = _tokens((1, 20), seed=5)
  np.testing.assert_allclose(
    np.asarray(model.forward(merged, jnp.asarray(tokens), config=cfg)),
    _torch_logits(out, tokens),
    atol=1e-4,
    rtol=0,
  )
  assert os.path.exists(os.path.join(out, "tokenizer.json"))
