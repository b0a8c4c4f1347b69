"""One-step off-policy rollouts (rl.loop.max_staleness=1): buffers built one update ahead,
in a worker thread or just before the update, the same either way; their staleness;
the buffer kept with a checkpoint; a run killed by SIGKILL and resumed, against the real
vLLM server."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time

import jax
import numpy as np
import pytest
import run_copies
import tiny_run
from paths import REPO
from rules import even_length
from test_rl_step import PROMPTS, RL, _ctx
from test_vllm_sampler import on_server
from transformers import AutoTokenizer

from rlvr import model, rollout
from rlvr.methods import plain
from rlvr.rollout import buffer_file
from rlvr.sampling import JaxSampler

AHEAD = dataclasses.replace(RL, max_staleness=1, dynamic_sampling=False)
_TIMING = (*tiny_run.TIMING, "overlap_frac")


def _run(sampler, lrn, tok, rl, overlap, steps=3):
  ctx = _ctx(sampler, tok, even_length)
  ctx.rl = rl
  lrn.shape, lrn.seed = rl.batch_shape, rl.seed
  lrn.pad_id = tok.pad_token_id
  method = plain.Plain(PROMPTS, seed=0)
  buffers = rollout.Buffers(method, ctx, overlap=overlap, last_step=steps)
  rows = []
  try:
    for step in range(steps):
      rows.append(rollout.rl_step(lrn, method, ctx, step, buffers=buffers))
  finally:
    buffers.close()
  return lrn.state, rows


def _equal_runs(a, b):
  (sa, ra), (sb, rb) = a, b
  for x, y in zip(jax.tree.leaves(sa.params), jax.tree.leaves(sb.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for x, y in zip(ra, rb):
    for k in x:
      if not k.startswith(_TIMING):
        assert x[k] == y[k], k


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  return cfg, params, AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])


def test_buffers_built_ahead_come_from_the_weights_one_update_behind(tiny, one_device_learner):
  cfg, params, tok = tiny

  def run(rl):
    lrn = one_device_learner(cfg, params, 1e-2)
    return _run(JaxSampler(cfg, params, tok), lrn, tok, rl, overlap=False)

  ahead, now = run(AHEAD), run(dataclasses.replace(AHEAD, max_staleness=0))
  # Step 0 samples version 0; every later buffer was sampled one update behind its update
  # (the sampler's own version tags).
  assert [r["staleness_mean"] for r in ahead[1]] == [0.0, 1.0, 1.0]
  assert [r["staleness_max"] for r in now[1]] == [0, 0, 0]
  assert all(r["overlap_frac"] == 0 for r in ahead[1])  # built before the update
  # Strict alternation trains on other samples from step 1 on.
  assert ahead[1][0]["reward_mean"] == now[1][0]["reward_mean"]
  assert any(
    not np.array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(ahead[0].params), jax.tree.leaves(now[0].params))
  )


def _update_while_sampling(lrn, sampler, updates: int) -> list[bool]:
  """Makes each of lrn's first `updates` updates return only once the sampler has begun a
  generate call in another thread (the next buffer's build), so that an update and a build
  overlap however loaded the machine is; returns whether each saw one (within 120 s)."""
  began, seen = threading.Event(), []
  generate, update = sampler.generate, lrn.update

  def generate_and_tell(*args, **kwargs):
    if threading.current_thread() is not threading.main_thread():
      began.set()
    return generate(*args, **kwargs)

  def update_until_sampling(*args, **kwargs):
    out = update(*args, **kwargs)
    if len(seen) < updates:
      seen.append(began.wait(timeout=120))
      began.clear()
    return out

  sampler.generate, lrn.update = generate_and_tell, update_until_sampling
  return seen


def test_a_worker_thread_changes_when_a_buffer_is_built_not_what_it_holds(
  vllm_server, served_model_dir, tmp_path, one_device_learner
):
  from rlvr.sampling.vllm_sampler import VLLMSampler

  cfg, params = model.load_hf(served_model_dir)
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  runs = []
  for overlap in (False, True):
    lrn = one_device_learner(cfg, params, 1e-2)
    sampler = VLLMSampler(
      vllm_server.url,
      model_config=cfg,
      eos_token_id=tok.eos_token_id,
      sync_dir=str(tmp_path / f"sync{overlap}"),
      sync_dtype=np.float32,
      weight_sync="transfer",
    )
    try:
      sampler.update_weights(lrn.state.params, version=0)
      # With the worker thread, the updates of steps 0 and 1 end after the builds of steps
      # 1 and 2 began (the last step builds nothing ahead).
      seen = _update_while_sampling(lrn, sampler, updates=2) if overlap else []
      runs.append(_run(sampler, lrn, tok, AHEAD, overlap=overlap))
    finally:
      sampler.close()
  assert seen == [True, True]  # each build ahead sampled in the worker thread
  _equal_runs(*runs)
  assert [r["staleness_max"] for r in runs[1][1]] == [0, 1, 1]
  assert all(r["overlap_frac"] > 0 for r in runs[1][1][:-1])


def test_a_buffer_kept_with_a_checkpoint_loads_back_exactly(tiny, tmp_path):
  cfg, params, tok = tiny
  ctx = _ctx(JaxSampler(cfg, params, tok), tok, even_length)
  buf = rollout.Buffers(plain.Plain(PROMPTS, seed=0), ctx, overlap=False).take(3, version=2)
  buf.metrics.update(method_count=np.int64(7), method_share=np.float32(0.5))  # numpy scalars
  buf.groups[0].tags["data_type"] = "original"  # a method's labels (the samples log's tags)
  path = buffer_file.save(str(tmp_path), buf)
  got = buffer_file.load(str(tmp_path), 3)
  assert (got.step, got.version) == (3, 2)
  assert got.metrics == {
    k: v.item() if isinstance(v, np.generic) else v for k, v in buf.metrics.items()
  }
  assert len(got.groups) == len(buf.groups) == RL.prompts_per_step
  for a, b in zip(buf.groups, got.groups):
    assert a.prompt == b.prompt and a.completions == b.completions and a.tags == b.tags
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.correct, b.correct)
  buffer_file.prune(str(tmp_path), [5])
  assert not os.path.exists(path)


def test_staleness_above_one_and_sampler_old_logprobs_are_refused():
  with pytest.raises(ValueError, match="max_staleness: expected 0 or 1, got 2"):
    dataclasses.replace(RL, max_staleness=2)
  from configs import tiny_rlvr
  from rlvr.run import experiment

  c = tiny_rlvr.get_config()
  c.rl.loop.max_staleness, c.rl.learner.old_logp = 1, "sampler"
  with pytest.raises(
    ValueError, match="rl.learner.old_logp: 'sampler' with rl.loop.max_staleness=1"
  ):
    experiment.check(c)


def _flags(vllm_server, served_model_dir, steps, *flags):
  return [
    *on_server(vllm_server, served_model_dir),
    *flags,
    "--config.sampler.weight_sync=transfer",
    "--config.data.arithmetic.n_sft=64",
    "--config.data.arithmetic.n_train=64",
    "--config.data.arithmetic.n_heldout=8",
    "--config.eval.sampling.n=2",
    f"--config.rl.steps={steps}",
    "--config.rl.loop.prompts_per_step=4",
    "--config.rl.loop.dynamic_sampling=False",
    "--config.rl.loop.max_staleness=1",
    "--config.checkpoint.every=2",
    "--config.reward_workers=1",
    "--config.export_hf=False",
  ]


def _train(workdir, *args):
  """The off-policy run to its end: (its output, its metrics rows). tests/ is on its path
  (echo_env, an environment defined outside the library)."""
  return tiny_run.train(workdir, *_flags(*args))


@pytest.fixture(scope="module")
def sft_run(vllm_server, served_model_dir, tmp_path_factory):
  """The runs' SFT, made once: their SFT settings are the same whatever the environment."""
  done = tmp_path_factory.mktemp("offpolicy") / "sft"
  _train(done, vllm_server, served_model_dir, 0)
  return done


@pytest.mark.slow
@pytest.mark.parametrize("environment", ["single_turn", "echo_env:make", "lora"])
def test_off_policy_run_killed_by_sigkill_resumes_as_if_uninterrupted(
  vllm_server, served_model_dir, sft_run, tmp_path, environment
):
  """Also with multi-turn episodes of a user's environment (tests/echo_env.py): the buffer
  kept with the checkpoint holds their masks, and the resumed run is the same run; and with
  LoRA in RL (adapters and the frozen base in the checkpoint; this server takes the merged
  weights, tests/sampling/test_vllm_lora.py the adapters)."""
  steps = 4
  flags = ["--config.env.max_total_tokens=120"]
  if environment == "lora":
    flags += ["--config.rl.learner.lora.rank=8", "--config.rl.learner.lora.dropout=0.1"]
    flags += ["--config.rl.learner.learning_rate=2e-3"]
    environment = "single_turn"
  flags.append(f"--config.env.name={environment}")
  run_copies.start_from_sft(sft_run, tmp_path / "full", evaluated=False)
  _, full = _train(tmp_path / "full", vllm_server, served_model_dir, steps, *flags)
  if environment != "single_turn":
    assert sum(r["turns_mean"] for r in full) / steps > 1
    assert sum(r["obs_tokens_frac"] for r in full) > 0
  assert [r["staleness_mean"] for r in full] == [0.0] + [1.0] * (steps - 1)
  assert all(r["overlap_frac"] > 0 for r in full[:-1])  # sampled in a thread during updates
  # The same command, killed by SIGKILL once the step-2 checkpoint (with step 2's buffer,
  # sampled during update 1) is written; the rerun resumes from it. It starts from the
  # full run's SFT and evaluation before RL (same seeds, same output).
  cut = tmp_path / "cut"
  run_copies.start_from_sft(tmp_path / "full", cut)
  proc = subprocess.Popen(
    tiny_run.argv(cut, *_flags(vllm_server, served_model_dir, steps, *flags)),
    cwd=REPO,
    env=tiny_run.env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  rows = cut / "metrics.jsonl"
  while proc.poll() is None and not (rows.exists() and rows.read_text().count("\n") >= 3):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, err[-3000:]
  assert os.path.exists(cut / "checkpoints_ahead" / "step_2.npz")
  log, resumed = _train(cut, vllm_server, served_model_dir, steps, *flags)
  assert "resumed rlvr from step 2" in log
  assert [r["step"] for r in resumed] == list(range(steps))
  for a, b in zip(full, resumed):
    for k in a:
      if not k.startswith(_TIMING):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["step"], k)
