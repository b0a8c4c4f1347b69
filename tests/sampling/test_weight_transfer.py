"""Weight sync through vLLM's weight-transfer API (`rlvr_tcp`) on the real vLLM CPU server."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from paths import REPO
from test_vllm_sampler import PROMPTS, _max_diff

from rlvr import model
from rlvr.sampling import SamplingParams
from rlvr.sampling.config import SamplerConfig
from rlvr.sampling.vllm_sampler import SamplerError, VLLMSampler

SP = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=3, ignore_eos=True)
TOL = 1e-5  # f32 on both sides


def _sampler(server, cfg, weight_sync, **kw):
  return VLLMSampler(
    server.url,
    model_config=cfg,
    eos_token_id=cfg.eos_token_id,
    model_name=server.options.served_model_name,
    sync_dtype=jnp.float32,
    weight_sync=weight_sync,
    **kw,
  )


def _reported(sampler):
  return sampler._session().get(sampler.urls[0] + "/weight_info").json()["weight_version"]


def _tokens(outs):
  return [[c.token_ids for c in g] for g in outs]


@pytest.fixture(scope="module")
def served(served_model_dir, tiny_dirs):
  cfg, params = model.load_hf(served_model_dir)
  # The fixture's model is untied on disk; push it as the tied policy it came from, so
  # the tied head goes out as lm_head.weight (what the disk path writes too).
  tied_cfg, _ = model.load_hf(tiny_dirs["qwen2"])
  assert tied_cfg.tie_word_embeddings and not cfg.tie_word_embeddings
  return cfg, params, tied_cfg


def test_transfer_serves_new_params_like_a_disk_sync(vllm_server, served, tmp_path):
  """Three versions pushed through the transfer API (several buckets each, over a kept
  prefix cache): the server reports each version and samples from it, within f32
  rounding of our forward, and exactly as after a disk sync of the same params."""
  cfg, params, tied_cfg = served
  by_transfer = _sampler(vllm_server, tied_cfg, "transfer", transfer_bucket_mb=1)
  by_disk = _sampler(vllm_server, tied_cfg, "disk", sync_dir=str(tmp_path))
  tied = {k: v for k, v in params.items() if k != "lm_head"}
  try:
    by_transfer.generate(PROMPTS, SP)  # fills the prefix cache
    for v in (1, 2, 3):
      new = jax.tree.map(lambda p, v=v: p * (1.0 + 0.05 * v) + 0.01 * v, tied)
      by_transfer.update_weights(new, version=10 + v)
      assert _reported(by_transfer) == str(10 + v)
      got = by_transfer.generate(PROMPTS, SP)
      assert all(c.weight_version == 10 + v for g in got for c in g)
      assert _max_diff(got, PROMPTS, new, tied_cfg) <= TOL
      assert _max_diff(got, PROMPTS, params, cfg) > 1e-2  # not the old weights
      by_disk.update_weights(new, version=20 + v)
      assert _reported(by_disk) == str(20 + v)
      again = by_disk.generate(PROMPTS, SP)
      assert _tokens(again) == _tokens(got)
      np.testing.assert_allclose(
        [c.logprobs for g in again for c in g], [c.logprobs for g in got for c in g], atol=1e-6
      )
  finally:
    by_transfer.update_weights(params, version=0)  # the session server is shared
    restored = by_disk.generate(PROMPTS, SP)
    by_transfer.close()
    by_disk.close()
  assert _max_diff(restored, PROMPTS, params, cfg) <= TOL


def test_a_transfer_broken_midway_is_detected(vllm_server, served, served_model_dir):
  """A trainer killed after part of its push leaves the server on the weights and version
  it had (sampling goes on); a client with no retries left names the server and that
  version; one with a retry recovers the server and pushes."""
  cfg, params, _ = served
  base = jax.tree.map(lambda p: p * 0.9, params)
  ours = _sampler(vllm_server, cfg, "transfer", retries=0)
  try:
    ours.update_weights(base, version=30)
    proc = subprocess.run(
      [
        sys.executable,
        "tests/weight_transfer_worker.py",
        vllm_server.url,
        served_model_dir,
        "31",
        "5",
      ],
      cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == -9 and "killing myself at tensor 5" in proc.stdout, proc.stderr
    assert _reported(ours) == "30"
    outs = ours.generate(PROMPTS, SP)
    assert _max_diff(outs, PROMPTS, base, cfg) <= TOL
    half = jax.tree.map(lambda p: p * 0.5, params)  # what the dead trainer was pushing
    assert _max_diff(outs, PROMPTS, half, cfg) > 1e-2
    with pytest.raises(
      SamplerError,
      match=re.escape(f"vLLM server {vllm_server.url}: weight transfer (rlvr_tcp) of version 32")
      + r".*already active.*it still serves version '30' \(its weights unchanged\)",
    ):
      ours.update_weights(half, version=32)
    assert _reported(ours) == "30"
    assert _max_diff(ours.generate(PROMPTS, SP), PROMPTS, base, cfg) <= TOL
  finally:
    ours.close()
  retrying = _sampler(vllm_server, cfg, "transfer", retries=1)
  try:
    retrying.update_weights(half, version=33)
    assert _reported(retrying) == "33"
    assert _max_diff(retrying.generate(PROMPTS, SP), PROMPTS, half, cfg) <= TOL
  finally:
    retrying.update_weights(params, version=0)  # the session server is shared
    retrying.close()


def test_weight_sync_settings_are_named():
  for kw, msg in (
    (dict(weight_sync="nfs"), "weight_sync: unknown 'nfs'; expected disk|transfer"),
    (dict(transfer_backend="ipc"), "transfer_backend: unknown 'ipc'"),
    (dict(transfer_bucket_mb=0), "transfer_bucket_mb: must be >= 1, got 0"),
  ):
    with pytest.raises(ValueError, match=re.escape(msg)):
      SamplerConfig(**kw)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_pushed_tensors_are_the_disk_checkpoints(tiny_dirs, family):
  """What a transfer sends (each tensor gathered on device from a sharded mesh, laid out
  and cast by XLA) is bit for bit what the disk path writes: names, order, values."""
  from rlvr.model import hf_io
  from rlvr.parallel import sharding
  from rlvr.sampling.weights import host_tensors

  mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
  cfg, params = model.load_hf(tiny_dirs[family], mesh=mesh)
  assert any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(params))
  for dtype in (jnp.float32, jnp.bfloat16):
    disk = [
      (k, np.ascontiguousarray(a.astype(dtype))) for k, a in hf_io.hf_tensors(cfg, params, True)
    ]
    sent = list(host_tensors(cfg, params, dtype))
    assert [k for k, _ in sent] == [k for k, _ in disk]
    for (k, a), (_, b) in zip(disk, sent):
      assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), k


@pytest.mark.slow
def test_a_restarted_server_is_found_out_and_takes_the_next_push(
  served, served_model_dir, tmp_path
):
  """A server that restarts mid-run comes back on its start-up checkpoint (version
  "default"): the client's next sampling call pushes it the weights it serves again
  (opening a new transfer engine), and later pushes go on as before."""
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  cfg, params, _ = served
  opts = ServerOptions(max_model_len=512, weight_transfer="rlvr_tcp")
  server = start_server(served_model_dir, opts, log_path=str(tmp_path / "a.log"))
  sampler = None
  try:
    sampler = _sampler(server, cfg, "transfer", retries=1)
    first = jax.tree.map(lambda p: p * 0.9, params)
    sampler.update_weights(first, version=1)
    assert _reported(sampler) == "1"
    server.stop()
    server = start_server(
      served_model_dir,
      dataclasses.replace(opts, port=int(server.url.rsplit(":", 1)[1])),
      log_path=str(tmp_path / "b.log"),
    )
    assert _reported(sampler) == "default"
    assert _max_diff(sampler.generate(PROMPTS, SP), PROMPTS, first, cfg) <= TOL
    assert _reported(sampler) == "1"
    second = jax.tree.map(lambda p: p * 0.8, params)
    sampler.update_weights(second, version=2)
    assert _reported(sampler) == "2"
    assert _max_diff(sampler.generate(PROMPTS, SP), PROMPTS, second, cfg) <= TOL
  finally:
    if sampler is not None:
      sampler.close()
    server.stop()
