"""A LoRA policy on a real vLLM CPU server with adapters enabled: each version goes out as
a PEFT adapter (rlvr.sampling.adapters), the server's logprobs are our merged model's, the
old adapter goes, a broken one is named, a restarted server gets the current one again,
and the merged fallback serves the same policy as full weights."""

from __future__ import annotations

import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_vllm_sampler import PROMPTS, _max_diff

from rlvr import model
from rlvr.model import lora, peft_io
from rlvr.model.lora import Adapted, LoraConfig
from rlvr.sampling import SamplingParams, adapters
from rlvr.sampling.vllm_sampler import SamplerError, VLLMSampler
from rlvr.sampling.vllm_server import ServerOptions, start_server

LC = LoraConfig(rank=4, alpha=8.0)
SP = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=3, ignore_eos=True)
TOL = 1e-4


@pytest.fixture(scope="module")
def lora_server(served_model_dir, tmp_path_factory):
  """A vLLM CPU server of the test model with runtime LoRA adapters up to rank 4."""
  log = str(tmp_path_factory.mktemp("lora_server") / "vllm.log")
  server = start_server(
    served_model_dir, ServerOptions(max_model_len=1024, lora_rank=LC.rank), log_path=log
  )
  print(f"\nvLLM server with LoRA up at {server.url} after {server.startup_s:.1f}s")
  yield server
  server.stop()


@pytest.fixture(scope="module")
def policy(served_model_dir):
  cfg, params = model.load_hf(served_model_dir)
  return cfg, params


def _adapters(params, seed):
  """Adapters with A and B non-zero (fresh ones have B = 0)."""
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map_with_path(
    lambda p, x: (
      jnp.asarray(rng.randn(*x.shape).astype(np.float32) * 0.05) if p[-1].key == "lora_b" else x
    ),
    lora.init_adapters(params, LC, jax.random.key(seed)),
  )


def _sampler(server, cfg, sync_dir, **kw):
  return VLLMSampler(
    server.url,
    model_config=cfg,
    eos_token_id=cfg.eos_token_id,
    sync_dir=str(sync_dir),
    model_name=server.options.served_model_name,
    retries=0,
    **kw,
  )


def _names(sampler):
  models = sampler._session().get(sampler.urls[0] + "/v1/models").json()["data"]
  return sorted(m["id"] for m in models)


def _timed(fn, *args):
  t = time.perf_counter()
  fn(*args)
  return time.perf_counter() - t


def test_each_version_is_served_as_its_own_adapter(lora_server, policy, tmp_path):
  cfg, params = policy
  sampler = _sampler(lora_server, cfg, tmp_path, lora_adapters=True)
  try:
    assert _max_diff(sampler.generate(PROMPTS, SP), PROMPTS, params, cfg) <= TOL  # the base
    times = []
    for version, seed in ((1, 1), (2, 2)):
      weights = Adapted(params, _adapters(params, seed), LC)
      times.append(_timed(sampler.update_weights, weights, version))
      outs = sampler.generate(PROMPTS, SP)
      assert all(c.weight_version == version for g in outs for c in g)
      merged = lora.merge(params, weights.adapters, LC)
      assert _max_diff(outs, PROMPTS, merged, cfg) <= TOL
      assert _max_diff(outs, PROMPTS, params, cfg) > 1e-2  # not the base
      # Only this version's adapter is loaded and kept on disk.
      assert {f"policy-v{v}" for v in (1, 2)} & set(_names(sampler)) == {f"policy-v{version}"}
      assert os.listdir(tmp_path) == [f"adapter_v{version}"]
    print(f"\nadapter push (tiny model, rank {LC.rank}): {times[-1] * 1e3:.0f} ms")
    sampler.update_weights(weights, 2)  # the same version again: loaded in place
    assert _max_diff(sampler.generate(PROMPTS, SP), PROMPTS, merged, cfg) <= TOL

    # A restarted server (it reports version "default" and holds no adapter) gets the
    # current adapter again before the next request.
    url = sampler.urls[0]
    sampler._session().post(url + "/v1/unload_lora_adapter", json={"lora_name": "policy-v2"})
    sampler._session().post(url + "/update_weight_version", json={"new_version": "default"})
    outs = sampler.generate(PROMPTS, SP)
    assert _max_diff(outs, PROMPTS, merged, cfg) <= TOL
    assert "policy-v2" in _names(sampler)
  finally:
    sampler.close()


def test_a_broken_adapter_is_named_and_the_old_one_stays(
  lora_server, policy, tmp_path, monkeypatch
):
  cfg, params = policy
  sampler = _sampler(lora_server, cfg, tmp_path, lora_adapters=True)
  try:
    good = Adapted(params, _adapters(params, 11), LC)
    sampler.update_weights(good, 11)
    merged = lora.merge(params, good.adapters, LC)
    # Wrong shapes: refused before anything reaches the server.
    bad = jax.tree.map(lambda x: x, good.adapters)
    bad["layers"]["mlp"]["up_kernel"]["lora_b"] = bad["layers"]["mlp"]["up_kernel"]["lora_b"][
      ..., :8
    ]
    with pytest.raises(
      SamplerError, match=r"LoRA adapter of version 12: .*up_kernel/lora_b has shape.*version 11"
    ):
      sampler.update_weights(Adapted(params, bad, LC), 12)

    # A file the server cannot load (a tensor too wide for the model): vLLM refuses it.
    save = peft_io.save_adapter

    def write_too_wide(path, model_cfg, lora_cfg, ads, dtype=None):
      out = save(path, model_cfg, lora_cfg, ads, dtype)
      fname = os.path.join(out, peft_io.WEIGHTS_FILE)
      src = peft_io.SafetensorsFile(fname)
      tensors = {k: np.array(src.get(k)) for k in src.keys()}
      key = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
      tensors[key] = np.ones((LC.rank, 2 * cfg.hidden_size), np.float32)
      del src
      peft_io.save_file(tensors, fname)
      return out

    monkeypatch.setattr(adapters.peft_io, "save_adapter", write_too_wide)
    with pytest.raises(
      SamplerError,
      match=re.escape(f"vLLM server {sampler.urls[0]}: loading the LoRA adapter of version 13")
      + r".*failed: HTTP 500: .*size of tensor.*it still serves version 11",
    ):
      sampler.update_weights(Adapted(params, _adapters(params, 13), LC), 13)
    assert sampler.version == 11
    outs = sampler.generate(PROMPTS, SP)
    assert all(c.weight_version == 11 for g in outs for c in g)
    assert _max_diff(outs, PROMPTS, merged, cfg) <= TOL
  finally:
    sampler.close()


def test_full_weights_and_the_merged_fallback(lora_server, policy, tmp_path):
  """A full-weight push takes the requests back to the base (the adapter goes); a sampler
  without adapters pushes an `Adapted` policy merged. Last: it changes the server's base."""
  cfg, params = policy
  sampler = _sampler(lora_server, cfg, tmp_path / "lora", lora_adapters=True)
  plain = _sampler(lora_server, cfg, tmp_path / "plain", sync_dtype=jnp.float32)
  try:
    weights = Adapted(params, _adapters(params, 21), LC)
    sampler.update_weights(weights, 21)
    merged = lora.merge(params, weights.adapters, LC)
    times = [_timed(sampler.update_weights, merged, v) for v in (22, 23)]
    outs = sampler.generate(PROMPTS, SP)
    assert all(c.weight_version == 23 for g in outs for c in g)
    assert _max_diff(outs, PROMPTS, merged, cfg) <= TOL
    assert "policy-v21" not in _names(sampler)
    print(f"\nfull-weight disk push (tiny model): {times[-1] * 1e3:.0f} ms")

    other = Adapted(params, _adapters(params, 24), LC)
    plain.update_weights(other, 24)
    outs = plain.generate(PROMPTS, SP)
    assert _max_diff(outs, PROMPTS, lora.merge(params, other.adapters, LC), cfg) <= TOL
  finally:
    plain.update_weights(params, 25)
    sampler.close()
    plain.close()
