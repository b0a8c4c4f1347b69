"""Decoder numerics against transformers' PyTorch models, HF round-trips, KV cache."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlvr import model
from rlvr.model import safetensors_io

FAMILIES = ["qwen2", "qwen3", "llama"]


def _torch_logits(path, tokens, attention_mask=None, position_ids=None):
  tm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  kw = {}
  if attention_mask is not None:
    kw["attention_mask"] = torch.tensor(attention_mask)
  if position_ids is not None:
    kw["position_ids"] = torch.tensor(position_ids)
  with torch.no_grad():
    return tm(torch.tensor(tokens), **kw).logits.numpy()


def _tokens(shape, seed=0, high=700):
  return np.random.RandomState(seed).randint(3, high, shape).astype(np.int32)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(tiny_dirs, family):
  cfg, params = model.load_hf(tiny_dirs[family])
  tokens = _tokens((2, 160))  # past llama's original_max_position_embeddings (64)
  ref = _torch_logits(tiny_dirs[family], tokens)
  ours = np.asarray(model.forward(params, jnp.asarray(tokens), config=cfg))
  assert ours.shape == ref.shape
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 1.0  # logits are far from uniform: the check has teeth


# Tiny models built and saved by transformers' own classes, so their config.json has the
# spellings the installed transformers writes (rope_parameters, num_local_experts, ...).
TRANSFORMERS_BUILT = {
  "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
  "qwen3": (
    "Qwen3Config",
    dict(head_dim=32, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
  ),
  "llama": (
    "LlamaConfig",
    dict(
      rope_parameters=dict(
        rope_type="llama3",
        rope_theta=5e5,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
      ),
    ),
  ),
  "qwen3_moe": (
    "Qwen3MoeConfig",
    dict(
      head_dim=32,
      num_hidden_layers=3,
      num_experts=4,
      num_experts_per_tok=2,
      moe_intermediate_size=48,
      norm_topk_prob=True,
      mlp_only_layers=[1],
    ),
  ),
}


@pytest.mark.parametrize("family", sorted(TRANSFORMERS_BUILT))
def test_a_model_saved_by_transformers_loads_with_equal_logits(family, tmp_path):
  import transformers

  name, kw = TRANSFORMERS_BUILT[family]
  kw = (
    dict(
      vocab_size=256,
      hidden_size=64,
      intermediate_size=96,
      num_hidden_layers=2,
      num_attention_heads=2,
      num_key_value_heads=1,
      initializer_range=0.1,
      max_position_embeddings=256,
    )
    | kw
  )
  torch.manual_seed(0)
  tm = AutoModelForCausalLM.from_config(getattr(transformers, name)(**kw), dtype=torch.float32)
  tm.save_pretrained(str(tmp_path))
  cfg, params = model.load_hf(str(tmp_path))
  assert (cfg.family, cfg.num_layers, cfg.head_dim) == (family, kw["num_hidden_layers"], 32)
  assert cfg.num_experts == kw.get("num_experts", 0)
  assert (cfg.rope_scaling is not None) == (family == "llama")
  tokens = _tokens((2, 96), high=256)  # past llama's original_max_position_embeddings (64)
  with torch.no_grad():
    ref = tm.eval()(torch.tensor(tokens)).logits.numpy()
  ours = np.asarray(model.forward(params, jnp.asarray(tokens), config=cfg))
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert np.abs(ref).max() > 1.0  # logits are far from uniform: the check has teeth


def test_llama3_rope_scaling_takes_effect(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["llama"])
  assert cfg.rope_scaling is not None
  tokens = jnp.asarray(_tokens((1, 160)))
  scaled = model.forward(params, tokens, config=cfg)
  import dataclasses

  plain = model.forward(params, tokens, config=dataclasses.replace(cfg, rope_scaling=None))
  assert float(jnp.abs(scaled - plain).max()) > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_transformers(tiny_dirs, family, side):
  cfg, params = model.load_hf(tiny_dirs[family])
  lengths = [40, 25, 9]
  t = max(lengths)
  tokens = _tokens((3, t), seed=1)
  mask = np.zeros((3, t), np.int32)
  for i, n in enumerate(lengths):
    if side == "left":
      mask[i, t - n :] = 1
    else:
      mask[i, :n] = 1
  tokens = np.where(mask == 1, tokens, 0)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  ref = _torch_logits(tiny_dirs[family], tokens, mask, positions)
  ours = np.asarray(
    model.forward(params, jnp.asarray(tokens), config=cfg, segment_ids=jnp.asarray(mask))
  )
  real = mask == 1
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)
  assert np.isfinite(ours).all()


def test_packed_segments_equal_separate_sequences(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen3"])
  a, b = _tokens((1, 12), seed=2), _tokens((1, 20), seed=3)
  packed = np.concatenate([a, b], axis=1)
  seg = np.array([[1] * 12 + [2] * 20])
  pos = np.array([list(range(12)) + list(range(20))])
  out = model.forward(
    params,
    jnp.asarray(packed),
    config=cfg,
    segment_ids=jnp.asarray(seg),
    positions=jnp.asarray(pos),
  )
  la = model.forward(params, jnp.asarray(a), config=cfg)
  lb = model.forward(params, jnp.asarray(b), config=cfg)
  np.testing.assert_allclose(out[:, :12], la, atol=1e-5)
  np.testing.assert_allclose(out[:, 12:], lb, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_hf_round_trip(tiny_dirs, family, tmp_path):
  cfg, params = model.load_hf(tiny_dirs[family])
  params = jax.tree.map(lambda p: p + 0.01 * jnp.sin(jnp.arange(p.size).reshape(p.shape)), params)
  out = model.save_hf(str(tmp_path / "copy"), cfg, params)
  cfg2, params2 = model.load_hf(out)
  assert cfg2 == cfg
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), params, params2
  )
  tokens = _tokens((2, 33), seed=4)
  ref = _torch_logits(out, tokens)
  ours = np.asarray(model.forward(params, jnp.asarray(tokens), config=cfg))
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_sharded_save_and_bf16(tiny_dirs, tmp_path):
  cfg, params = model.load_hf(tiny_dirs["llama"])
  out = model.save_hf(str(tmp_path / "sharded"), cfg, params, max_shard_bytes=200_000)
  index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
  assert len(set(index["weight_map"].values())) > 2
  _, params2 = model.load_hf(out)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), params, params2)
  tokens = _tokens((1, 20), seed=5)
  np.testing.assert_allclose(
    _torch_logits(out, tokens), model.forward(params, jnp.asarray(tokens), config=cfg), atol=1e-4
  )
  bf = model.save_hf(str(tmp_path / "bf16"), cfg, params, dtype=jnp.bfloat16)
  _, pbf = model.load_hf(bf, dtype=jnp.bfloat16)
  assert jax.tree.leaves(pbf)[0].dtype == jnp.bfloat16
  tm = AutoModelForCausalLM.from_pretrained(bf)
  assert next(tm.parameters()).dtype == torch.bfloat16
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x.astype(jnp.bfloat16)), np.asarray(y)),
    params,
    pbf,
  )


def test_load_onto_mesh_places_each_param(tiny_dirs):
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  cfg, params = model.load_hf(tiny_dirs["qwen2"], mesh=mesh)
  attn = params["layers"]["attn"]
  assert attn["q_kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
  assert attn["k_kernel"].sharding.spec == P(None, "fsdp", None, None)  # 2 KV heads < tensor=4
  assert params["embedding"].sharding.spec == P("tensor", "fsdp")
  assert len(attn["q_kernel"].addressable_shards) == 8
  _, host = model.load_hf(tiny_dirs["qwen2"])
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), params, host
  )
  tokens = jnp.asarray(_tokens((2, 16)))
  np.testing.assert_allclose(
    model.forward(params, tokens, config=cfg), model.forward(host, tokens, config=cfg), atol=1e-5
  )


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_decoding_equals_full_forward(tiny_dirs, family):
  cfg, params = model.load_hf(tiny_dirs[family])
  prompt_len, new = 10, 6
  tokens = _tokens((2, prompt_len + new), seed=6)
  seg = np.ones_like(tokens)
  seg[1, :4] = 0  # row 1 is left-padded by 4
  tokens = np.where(seg == 1, tokens, 0)
  full = np.asarray(
    model.forward(params, jnp.asarray(tokens), config=cfg, segment_ids=jnp.asarray(seg))
  )
  cache = model.KVCache.empty(cfg, batch=2, slots=prompt_len + new + 3)
  logits, cache = model.forward(
    params,
    jnp.asarray(tokens[:, :prompt_len]),
    config=cfg,
    segment_ids=jnp.asarray(seg[:, :prompt_len]),
    cache=cache,
  )
  steps = [np.asarray(logits)]
  step = jax.jit(lambda p, t, c: model.forward(p, t, config=cfg, cache=c))
  for i in range(prompt_len, prompt_len + new):
    logits, cache = step(params, jnp.asarray(tokens[:, i : i + 1]), cache)
    steps.append(np.asarray(logits))
  inc = np.concatenate(steps, axis=1)
  real = seg == 1
  np.testing.assert_allclose(inc[real], full[real], atol=1e-4, rtol=0)
  assert int(cache.index) == prompt_len + new


# Full-size configs, as their config.json files say (written here; nothing downloaded).
FULL_SIZE = {
  "Qwen2.5-32B": dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=152064,
    hidden_size=5120,
    intermediate_size=27648,
    num_hidden_layers=64,
    num_attention_heads=40,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
  ),
  "Qwen2.5-3B": dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
  ),
  "Qwen2.5-Math-7B": dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
  ),
  "Llama-3.1-8B": dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=128000,
    eos_token_id=128001,
    rope_scaling=dict(
      rope_type="llama3",
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=8192,
    ),
  ),
  "Qwen3-4B": dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    attention_bias=False,
  ),
  "Qwen3-30B-A3B": dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=False,
    max_position_embeddings=40960,
    attention_bias=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
  ),
}


@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_full_size_param_counts_match_transformers(name):
  hf = FULL_SIZE[name]
  ours = model.count_params(model.ModelConfig.from_hf(hf))
  tcfg = AutoConfig.for_model(**{k: v for k, v in hf.items() if k != "architectures"})
  with torch.device("meta"):
    tm = AutoModelForCausalLM.from_config(tcfg)
  theirs = sum(p.numel() for p in tm.parameters())
  assert ours == theirs, (name, ours, theirs)
  # The same model as the installed transformers writes its config.json (its spellings:
  # rope_parameters, num_local_experts, layer_types, ...).
  written = json.loads(tcfg.to_json_string())
  assert model.ModelConfig.from_hf(dict(written, architectures=hf["architectures"])) == (
    model.ModelConfig.from_hf(hf)
  )


# ------------------------------------------------------------------ bad input
def test_unsupported_architecture_is_named():
  hf = dict(FULL_SIZE["Qwen2.5-3B"], architectures=["GPT2LMHeadModel"])
  with pytest.raises(model.ConfigError, match="architectures.*GPT2LMHeadModel"):
    model.ModelConfig.from_hf(hf)


def test_sliding_window_layers_are_refused():
  hf = FULL_SIZE["Qwen3-4B"]
  types = ["full_attention"] * 35 + ["sliding_attention"]
  with pytest.raises(model.ConfigError, match=r"sliding-window attention \(layers \[35\]\)"):
    model.ModelConfig.from_hf(dict(hf, layer_types=types))
  with pytest.raises(model.ConfigError, match=r"layers \[28, 29, 30"):
    model.ModelConfig.from_hf(dict(hf, use_sliding_window=True, max_window_layers=28))
  assert model.ModelConfig.from_hf(dict(hf, layer_types=["full_attention"] * 36))


def test_missing_config_field_is_named(tiny_dirs, tmp_path):
  d = str(tmp_path / "broken")
  shutil.copytree(tiny_dirs["qwen2"], d)
  cfg = json.load(open(os.path.join(d, "config.json")))
  del cfg["intermediate_size"]
  json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
  with pytest.raises(model.ConfigError, match="'intermediate_size'"):
    model.load_hf(d)


def test_missing_tensor_is_named(tiny_dirs, tmp_path):
  d = str(tmp_path / "missing")
  shutil.copytree(tiny_dirs["qwen3"], d)
  f = safetensors_io.SafetensorsFile(os.path.join(d, "model.safetensors"))
  tensors = {
    k: np.array(f.get(k)) for k in f.keys() if k != "model.layers.1.self_attn.k_norm.weight"
  }
  del f
  safetensors_io.save_file(tensors, os.path.join(d, "model.safetensors"))
  with pytest.raises(model.CheckpointError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
    model.load_hf(d)


def test_shape_mismatch_is_named(tiny_dirs, tmp_path):
  d = str(tmp_path / "mismatch")
  shutil.copytree(tiny_dirs["qwen2"], d)
  cfg = json.load(open(os.path.join(d, "config.json")))
  cfg["intermediate_size"] = 384
  json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
  with pytest.raises(
    model.CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*\(256, 128\)"
  ):
    model.load_hf(d)


def test_save_hf_rejects_params_of_another_config(tiny_dirs, tmp_path):
  import dataclasses

  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  with pytest.raises(model.CheckpointError, match="layers/mlp/gate_kernel"):
    model.save_hf(str(tmp_path / "x"), dataclasses.replace(cfg, intermediate_size=64), params)


@pytest.mark.parametrize("shape", [(64, 48, 80), (30, 17, 9)])
def test_low_precision_matmul_and_grads_match_float64(shape):
  """bf16 on CPU goes through `lowp.matmul` (f32 accumulation, backward dots
  re-laid out, x^T kept as the residual): values and both gradients equal the float64
  products of the same bf16 inputs to bf16 rounding, and the f32 path is untouched."""
  from rlvr.model import layers

  n, d, f = shape
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(2, n // 2, d), jnp.bfloat16)  # n rows in two batches
  w = jnp.asarray(rng.randn(d, f) / np.sqrt(d), jnp.bfloat16)
  g = jnp.asarray(rng.randn(*x.shape[:-1], f), jnp.bfloat16)
  y, vjp = jax.vjp(layers.dense, x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
  x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
  x2, g2 = x64.reshape(-1, d), g64.reshape(-1, f)
  for got, want in ((y, x64 @ w64), (dx, g64 @ w64.T), (dw, x2.T @ g2)):
    want = want.reshape(got.shape)
    # One bf16 rounding of the f32 sum: relative 2^-8 of the magnitude.
    np.testing.assert_allclose(
      np.asarray(got, np.float64), want, rtol=0, atol=2.0**-8 * np.abs(want).max()
    )
  # The same call in f32 is a plain matmul, bit for bit.
  x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
  np.testing.assert_array_equal(layers.dense(x32, w32), (x32.reshape(-1, d) @ w32).reshape(y.shape))


def test_logits_matmul_keeps_f32_logits_and_rounds_only_the_gradient():
  """`lowp.logits_matmul` in bf16 on CPU: f32 logits of the bf16 inputs (f32 sums,
  no bf16 rounding of the logits), gradients from the bf16-rounded cotangent."""
  from rlvr.model import lowp

  rng = np.random.RandomState(1)
  x = jnp.asarray(rng.randn(24, 40), jnp.bfloat16)
  w = jnp.asarray(rng.randn(40, 96) / np.sqrt(40), jnp.float32)  # f32 master weights
  g = jnp.asarray(rng.randn(24, 96), jnp.float32)
  z, vjp = jax.vjp(lowp.logits_matmul, x, w)
  dx, dw = vjp(g)
  assert z.dtype == jnp.float32 and dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  x64 = np.asarray(x, np.float64)
  w64 = np.asarray(w.astype(jnp.bfloat16), np.float64)
  g64 = np.asarray(g.astype(jnp.bfloat16), np.float64)
  want = x64 @ w64
  np.testing.assert_allclose(
    np.asarray(z, np.float64), want, rtol=0, atol=1e-5 * np.abs(want).max()
  )
  for got, want in ((dx, g64 @ w64.T), (dw, x64.T @ g64)):
    np.testing.assert_allclose(
      np.asarray(got, np.float64), want, rtol=0, atol=2.0**-8 * np.abs(want).max()
    )


@pytest.mark.parametrize("remat", [False, True])
def test_unrolled_layers_equal_the_layer_scan(tiny_dirs, remat):
  """scan_layers=False runs the same stacked parameters layer by layer: the same logits
  and parameter gradients as the scan (f32), with and without remat."""
  cfg, params = model.load_hf(tiny_dirs["qwen3"])
  tokens = jnp.asarray(_tokens((2, 12), seed=3))
  seg = jnp.asarray(np.r_[[1] * 12, [1] * 9 + [0] * 3].reshape(2, 12))

  def loss(p, scan):
    logits = model.forward(p, tokens, config=cfg, segment_ids=seg, remat=remat, scan_layers=scan)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * seg), logits

  (l0, z0), g0 = jax.value_and_grad(loss, has_aux=True)(params, True)
  (l1, z1), g1 = jax.value_and_grad(loss, has_aux=True)(params, False)
  np.testing.assert_allclose(z1, z0, rtol=1e-5, atol=1e-5)  # f32 rounding of other fusions
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
  if not remat:  # prefill then one decoding step with the KV cache, both ways
    outs = []
    for scan in (True, False):
      cache = model.KVCache.empty(cfg, batch=2, slots=16)
      z, cache = model.forward(
        params, tokens, config=cfg, segment_ids=seg, cache=cache, scan_layers=scan
      )
      z2, cache = model.forward(params, tokens[:, :1], config=cfg, cache=cache, scan_layers=scan)
      outs.append((z, z2, cache.k))
    for a, b in zip(*outs):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
