"""The learner: micro-batch invariance, sharding, multi-host, resume, learning sanity."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import learner_worker as worker
import numpy as np
import pytest
from paths import TESTS

from rlvr import learner, model
from rlvr.parallel import sharding
from rlvr.run import checkpoint

WORKER = os.path.join(TESTS, "learner_worker.py")


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
  return tiny_dirs["qwen2"], *model.load_hf(tiny_dirs["qwen2"])


def _batch(step, vocab, mesh):
  return learner.TrainBatch(
    **jax.device_put(worker.make_batch(step, vocab), sharding.batch_sharding(mesh, 1))
  )


def _run(cfg, params, lc, mesh_axes, steps=1, devices=None):
  mesh = sharding.make_mesh(mesh_axes, devices)
  state = learner.init_state(cfg, lc, params, mesh)
  update = learner.make_update_fn(cfg, lc, mesh)
  metrics = None
  for s in range(steps):
    batch = learner.TrainBatch(
      **{
        k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim))
        for k, v in worker.make_batch(s, cfg.vocab_size).items()
      }
    )
    state, metrics = update(state, batch)
  return state, metrics


def _assert_params_close(a, b, rtol=1e-5, atol=1e-7):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(
      np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
    )


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_same_update(tiny, aggregation):
  _, cfg, params = tiny
  one = worker.learner_config(micro_batches=1, aggregation=aggregation)
  four = worker.learner_config(micro_batches=4, aggregation=aggregation)
  s1, m1 = _run(cfg, params, one, {"fsdp": 1}, devices=jax.devices()[:1])
  s4, m4 = _run(cfg, params, four, {"fsdp": 1}, devices=jax.devices()[:1])
  np.testing.assert_allclose(float(m1["loss"]), float(m4["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(m1["grad_norm"]), float(m4["grad_norm"]), rtol=1e-5)
  _assert_params_close(s1.params, s4.params)
  moved = max(
    float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(params))
  )
  assert moved > 1e-4  # the update did something
  rows = worker.make_batch(0, cfg.vocab_size)["tokens_bt"].shape[0]
  by_rows = worker.learner_config(micro_batch_rows=rows // 4, aggregation=aggregation)
  assert by_rows.micro_count(rows) == 4
  s4r, m4r = _run(cfg, params, by_rows, {"fsdp": 1}, devices=jax.devices()[:1])
  assert float(m4r["loss"]) == float(m4["loss"])
  _assert_params_close(s4r.params, s4.params, rtol=0, atol=0)
  with pytest.raises(ValueError, match="micro_batch_rows"):
    by_rows.micro_count(rows + 1)


def test_auto_micro_batches_follow_the_compilers_plan(tiny):
  """micro_batches=0 takes one micro-batch when the planned temporaries fit the budget and
  as many as the rows allow when nothing fits; the step is the one those counts give."""
  _, cfg, params = tiny
  one = worker.learner_config(micro_batches=1)
  roomy = worker.learner_config(micro_batches=0, micro_memory_gb=64.0)
  tight = worker.learner_config(micro_batches=0, micro_memory_gb=1e-9)
  rows = worker.make_batch(0, cfg.vocab_size)["tokens_bt"].shape[0]
  s1, m1 = _run(cfg, params, one, {"fsdp": 1}, devices=jax.devices()[:1])
  sr, mr = _run(cfg, params, roomy, {"fsdp": 1}, devices=jax.devices()[:1])
  assert (m1["micro_batches"], mr["micro_batches"]) == (1, 1)
  assert float(mr["loss"]) == float(m1["loss"])
  _assert_params_close(sr.params, s1.params, rtol=0, atol=0)
  st, mt = _run(cfg, params, tight, {"fsdp": 2}, devices=jax.devices()[:2])
  assert mt["micro_batches"] == rows // 2  # one row per device per micro-batch
  _assert_params_close(st.params, s1.params)


@pytest.mark.parametrize(
  "mesh_axes", [{"fsdp": 8}, {"data": 2, "fsdp": 2, "tensor": 2}, {"tensor": 8}]
)
def test_sharded_update_equals_single_device(tiny, mesh_axes):
  _, cfg, params = tiny
  lc = worker.learner_config(micro_batches=2)
  ref, mref = _run(cfg, params, lc, {"fsdp": 1}, steps=2, devices=jax.devices()[:1])
  got, mgot = _run(cfg, params, lc, mesh_axes, steps=2)
  np.testing.assert_allclose(float(mref["loss"]), float(mgot["loss"]), rtol=1e-5)
  _assert_params_close(ref.params, got.params, rtol=1e-5, atol=1e-6)
  # shardings are the ones the rules ask for (axes that do not divide are dropped):
  # q_kernel [layers 2, embed 128, heads 4, head_dim 32], gate_kernel [2, embed 128, mlp 256]
  q_shard, gate_shard = {
    "fsdp=8": ((2, 16, 4, 32), (2, 16, 256)),
    "data=2,fsdp=2,tensor=2": ((2, 64, 2, 32), (2, 64, 128)),
    "tensor=8": ((2, 128, 4, 32), (2, 128, 32)),  # 4 heads cannot split 8 ways
  }[",".join(f"{k}={v}" for k, v in mesh_axes.items())]
  for tree in (got.params, got.opt_state[1][0].mu, got.opt_state[1][0].nu):
    assert tree["layers"]["attn"]["q_kernel"].sharding.shard_shape((2, 128, 4, 32)) == q_shard
    assert tree["layers"]["mlp"]["gate_kernel"].sharding.shard_shape((2, 128, 256)) == gate_shard


def _step(cfg, params, lc, mesh_axes, arrays, devices=None):
  mesh = sharding.make_mesh(mesh_axes, devices)
  batch = learner.TrainBatch(
    **{k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in arrays.items()}
  )
  return learner.make_update_fn(cfg, lc, mesh)(learner.init_state(cfg, lc, params, mesh), batch)


@pytest.mark.parametrize(
  "policy_loss,aggregation",
  [("gspo", "seq-mean-token-mean"), ("gspo_token", "seq-mean-token-mean"), ("cispo", "token-mean")],
)
def test_new_losses_are_micro_batch_and_mesh_invariant(tiny, policy_loss, aggregation):
  """Off-policy (old logprobs != the current ones) with sequence TIS and sequence masking:
  4 micro-batches, and 2 on a data x fsdp x tensor mesh, make the one-device step."""
  _, cfg, params = tiny
  b = worker.make_batch(0, cfg.vocab_size)
  logp = learner.make_logprob_fn(cfg, worker.learner_config())(params, learner.TrainBatch(**b))
  rng = np.random.RandomState(7)
  old = np.asarray(logp) + 0.3 * rng.randn(worker.B, worker.T)
  sampler = old - 0.05 * rng.randn(worker.B, worker.T)
  sampler[:2] += 1.0  # geometric-mean ratio e^-1 < 1/2: these two sequences are dropped
  arrays = dict(b, old_logp_bt=old.astype(np.float32), sampler_logp_bt=sampler.astype(np.float32))
  lc = lambda m: worker.learner_config(
    micro_batches=m,
    policy_loss=policy_loss,
    aggregation=aggregation,
    tis_cap=2.0,
    tis_level="sequence",
    seq_mask_cap=2.0,
  )
  one = jax.devices()[:1]
  s1, m1 = _step(cfg, params, lc(1), {"fsdp": 1}, arrays, one)
  for got, m in (
    _step(cfg, params, lc(4), {"fsdp": 1}, arrays, one),
    _step(cfg, params, lc(2), {"data": 2, "fsdp": 2, "tensor": 2}, arrays),
  ):
    for k in ("loss", "grad_norm", "clip_frac_low", "clip_frac_high", "is_capped_frac"):
      np.testing.assert_allclose(float(m[k]), float(m1[k]), rtol=1e-5, atol=1e-7, err_msg=k)
    assert float(m["seq_masked_frac"]) == float(m1["seq_masked_frac"]) == 0.25
    _assert_params_close(s1.params, got.params, rtol=1e-5, atol=1e-6)
  assert float(m1["grad_norm"]) > 0


def test_learning_sanity_logprob_moves_with_advantage_sign(tiny):
  _, cfg, params = tiny
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  lc = worker.learner_config(micro_batches=1)
  b = worker.make_batch(0, cfg.vocab_size)
  logp_fn = learner.make_logprob_fn(cfg, lc)
  for sign in (1.0, -1.0):
    batch = learner.TrainBatch(**dict(b, advantages=np.full(worker.B, sign, np.float32)))
    mask = np.asarray(learner.loss_mask(batch, lc))
    state = learner.init_state(cfg, lc, params, mesh)
    update = learner.make_update_fn(cfg, lc, mesh)
    before = float((np.asarray(logp_fn(state.params, batch)) * mask).sum())
    for _ in range(5):
      state, _ = update(state, batch)
    after = float((np.asarray(logp_fn(state.params, batch)) * mask).sum())
    assert (after - before) * sign > 1.0, (sign, before, after)


def test_remat_policies_give_the_same_update(tiny):
  """Remat only trades memory for recompute: each policy makes the plain step's update."""
  _, cfg, params = tiny
  dev = jax.devices()[:1]
  s0, m0 = _run(cfg, params, worker.learner_config(), {"fsdp": 1}, devices=dev)
  for policy in ("nothing", "dots"):
    s, m = _run(
      cfg, params, worker.learner_config(remat=True, remat_policy=policy), {"fsdp": 1}, devices=dev
    )
    np.testing.assert_allclose(float(m["loss"]), float(m0["loss"]), rtol=1e-6)
    _assert_params_close(s.params, s0.params)
  with pytest.raises(ValueError, match="remat_policy"):
    worker.learner_config(remat=True, remat_policy="everything")


def test_kl_and_masks_and_tis_run(tiny):
  _, cfg, params = tiny
  lc = worker.learner_config(
    kl_beta=0.1,
    mask_truncated=True,
    tis_cap=2.0,
    compute_dtype="bfloat16",
    remat=True,
    lr_schedule="cosine",
    warmup_steps=2,
    total_steps=10,
  )
  mesh = sharding.make_mesh({"fsdp": 2}, jax.devices()[:2])
  state = learner.init_state(cfg, lc, params, mesh)
  assert state.ref_params is not None
  assert jax.tree.leaves(state.ref_params)[0].dtype == jnp.bfloat16
  b = worker.make_batch(0, cfg.vocab_size)
  trunc = np.zeros(worker.B, bool)
  trunc[:4] = True
  sampler = np.asarray(learner.make_logprob_fn(cfg, lc)(params, learner.TrainBatch(**b))) - 0.05
  batch = learner.TrainBatch(**b, sampler_logp_bt=sampler, truncated=trunc)
  update = learner.make_update_fn(cfg, lc, mesh)
  state, m = update(state, batch)
  expected_tokens = (np.asarray(learner.loss_mask(batch, lc))).sum()
  assert float(m["tokens"]) == expected_tokens < (b["loss_mask_bt"] * b["segment_bt"]).sum()
  assert float(m["kl"]) == pytest.approx(0.0, abs=1e-3)  # first step: policy == reference
  assert 0.04 < float(m["mismatch_abs"]) < 0.07  # bf16 forward vs the shifted f32 logprobs
  assert float(m["lr"]) == 0.0  # warmup starts at 0
  state, m = update(state, batch)
  assert float(m["lr"]) > 0 and np.isfinite(float(m["loss"]))


def test_bad_learner_config_is_named():
  with pytest.raises(ValueError, match="aggregation"):
    learner.LearnerConfig(aggregation="mean")
  for field, bad in (
    ("micro_batch_rows", -1),
    ("eps_low", 1.5),
    ("dual_clip", 0.5),
    ("tis_cap", 0.0),
  ):
    with pytest.raises(ValueError, match=field):
      learner.LearnerConfig(**{field: bad})
  with pytest.raises(ValueError, match="mesh axes"):
    sharding.make_mesh({"fsdp": 3})


def _worker(args, **kw):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, WORKER, *args], env=env, **kw)


def _load(path):
  z = np.load(path)
  return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_multi_host_equals_single_process(tiny, tmp_path):
  path, cfg, params = tiny
  from rlvr.sampling.vllm_server import free_port

  port = free_port()
  procs = [
    _worker(
      [
        "--model",
        path,
        "--out",
        str(tmp_path / "mh.npz"),
        "--steps",
        "3",
        "--mesh",
        "fsdp=4",
        "--devices",
        "2",
        "--num_processes",
        "2",
        "--process_id",
        str(i),
        "--port",
        str(port),
        "--export",
        str(tmp_path / "hf"),
      ]
    )
    for i in range(2)
  ]
  assert [p.wait(timeout=600) for p in procs] == [0, 0]
  single = _worker(
    [
      "--model",
      path,
      "--out",
      str(tmp_path / "sp.npz"),
      "--steps",
      "3",
      "--mesh",
      "fsdp=4",
      "--devices",
      "4",
    ]
  )
  assert single.wait(timeout=600) == 0
  mh, sp = _load(tmp_path / "mh.npz"), _load(tmp_path / "sp.npz")
  assert mh.keys() == sp.keys() and int(mh["__step__"]) == 3
  for k in sp:
    np.testing.assert_allclose(mh[k], sp[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # The HF export of parameters sharded over both processes: written once, by process 0,
  # and equal to the gathered parameters.
  _, exported = model.load_hf(str(tmp_path / "hf"))
  for p, x in jax.tree_util.tree_leaves_with_path(exported):
    key = "/".join(str(getattr(k, "key", k)) for k in p)
    np.testing.assert_array_equal(np.asarray(x), mh[key], err_msg=key)


@pytest.mark.slow
def test_resume_in_new_process_on_another_mesh(tiny, tmp_path):
  path, _, _ = tiny
  ckpt = str(tmp_path / "ckpt")
  full = _worker(
    ["--model", path, "--out", str(tmp_path / "full.npz"), "--steps", "3", "--mesh", "fsdp=4"]
  )
  first = _worker(
    [
      "--model",
      path,
      "--out",
      str(tmp_path / "a.npz"),
      "--steps",
      "2",
      "--mesh",
      "fsdp=4",
      "--ckpt",
      ckpt,
      "--save_at",
      "2",
    ]
  )
  assert full.wait(timeout=600) == 0 and first.wait(timeout=600) == 0
  second = _worker(
    [
      "--model",
      path,
      "--out",
      str(tmp_path / "b.npz"),
      "--steps",
      "3",
      "--mesh",
      "data=2,tensor=2",
      "--ckpt",
      ckpt,
      "--resume",
    ]
  )
  assert second.wait(timeout=600) == 0
  a, b = _load(tmp_path / "full.npz"), _load(tmp_path / "b.npz")
  assert int(b["__step__"]) == 3
  for k in a:
    np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_checkpoint_keeps_last_n_and_exports_hf(tiny, tmp_path):
  path, cfg, params = tiny
  lc = worker.learner_config()
  mesh = sharding.make_mesh({"fsdp": 2}, jax.devices()[:2])
  state = learner.init_state(cfg, lc, params, mesh)
  update = learner.make_update_fn(cfg, lc, mesh)
  mngr = checkpoint.manager(str(tmp_path / "ck"), keep=2)
  for s in range(3):
    state, _ = update(state, _batch(s, cfg.vocab_size, mesh))
    checkpoint.save(mngr, state, {"data_position": s + 1, "config": {"lr": lc.learning_rate}})
  assert mngr.all_steps() == [2, 3]
  restored, meta = checkpoint.restore(mngr, checkpoint.abstract_state(cfg, lc, mesh))
  assert meta["data_position"] == 3 and meta["versions"]["jax"] == jax.__version__
  _assert_params_close(state.params, restored.params, rtol=0, atol=0)
  out = checkpoint.export_hf(str(tmp_path / "hf"), cfg, restored)
  _, loaded = model.load_hf(out)
  _assert_params_close(state.params, loaded, rtol=0, atol=0)
  mngr.close()
