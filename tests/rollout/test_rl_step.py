"""The RL step: dynamic sampling, batch layout, one step with each sampler, and a
method defined only in this test folder (tests/counting_method.py) run by the runner,
killed and resumed with its own state."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
import run_copies
import run_output
import tiny_run
from paths import REPO
from rules import even_length
from step_context import InOrder, step_context
from transformers import AutoTokenizer

from rlvr import learner, model, rollout
from rlvr.learner import packing
from rlvr.methods import plain
from rlvr.run import outcome
from rlvr.sampling import JaxSampler


def always_right(texts, golds, prompts=None):
  r = np.ones(len(texts), np.float32)
  return r, r > 0


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
  cfg, params = model.load_hf(tiny_dirs["qwen2"])
  tok = AutoTokenizer.from_pretrained(tiny_dirs["qwen2"])
  return cfg, params, tok


RL = rollout.RLConfig(
  prompts_per_step=4, group_size=4, max_prompt_len=8, max_response_len=8, max_extra_rounds=2
)
PROMPTS = [rollout.Prompt((5 + i, 6 + i, 7 + i), "0") for i in range(64)]


def _ctx(sampler, tok, score_fn):
  return step_context(sampler, score_fn, tok, rl=RL)


def test_dynamic_sampling_keeps_mixed_groups_and_fills_the_batch(tiny):
  cfg, params, tok = tiny
  sampler = JaxSampler(cfg, params, tok)
  pool = InOrder(PROMPTS)
  kept, sampled, rounds = _ctx(sampler, tok, even_length).gather(pool, step=0)
  assert len(kept) == RL.prompts_per_step
  assert all(g.mixed for g in kept)
  assert len(sampled) == pool.drawn >= len(kept)
  assert set(id(g) for g in kept) <= set(id(g) for g in sampled)
  arrays = packing.build_batch(kept, learner.LearnerConfig(), RL.batch_shape, tok.pad_token_id)
  assert arrays["tokens_bt"].shape == (RL.rows, RL.seq_len)
  # advantages: zero-mean within each group, completion tokens in the loss only
  adv = arrays["advantages"].reshape(RL.prompts_per_step, RL.group_size)
  np.testing.assert_allclose(adv.mean(axis=1), 0, atol=1e-6)
  for r, (g, c) in enumerate((grp, c) for grp in kept for c in grp.completions):
    p = len(g.prompt.ids)
    assert tuple(arrays["tokens_bt"][r, :p]) == g.prompt.ids
    assert arrays["loss_mask_bt"][r, :p].sum() == 0
    assert arrays["loss_mask_bt"][r].sum() == len(c.token_ids)
    np.testing.assert_allclose(arrays["sampler_logp_bt"][r, p : p + len(c.token_ids)], c.logprobs)


def test_all_solved_data_ends_with_a_clear_message(tiny):
  cfg, params, tok = tiny
  pool = InOrder(PROMPTS)
  with pytest.raises(rollout.NoSignalError) as e:
    _ctx(JaxSampler(cfg, params, tok), tok, always_right).gather(pool, step=0)
  assert str(e.value) == (
    "step 0: no group with mixed rewards in 20 prompts over 3 rounds (solve_all 100%, "
    "solve_none 0%); the problems are too easy for the policy: give harder ones; or raise "
    "rl.loop.max_extra_rounds"
  )
  # bounded: 4 prompts, then 2 x 8 over-sampled prompts
  assert pool.drawn == 4 + 8 + 8

  # A random (untrained) policy gets everything wrong: the message names the two fixes.
  def always_wrong(texts, golds, prompts=None):
    r = np.zeros(len(texts), np.float32)
    return r, r > 0

  with pytest.raises(rollout.NoSignalError) as e:
    _ctx(JaxSampler(cfg, params, tok), tok, always_wrong).gather(InOrder(PROMPTS), step=0)
  fix = (
    "the problems are too hard for the policy: warm-start it with SFT (sft.steps > 0, on "
    "worked solutions) or start from a trained checkpoint (model.path)"
  )
  assert str(e.value).endswith(
    f"(solve_all 0%, solve_none 100%); {fix}; or raise rl.loop.max_extra_rounds"
  ), str(e.value)
  # The run's own check, when every step of an invocation skipped its update (no dynamic
  # sampling): the same fix.
  assert outcome.no_update_message([(0.0, 1.0), (0.0, 0.5)], "/w") == (
    "every one of the 2 RL steps skipped its update: no group had a learning signal "
    f"(reward variance; solve_all 0%, solve_none 75%); {fix}; see /w/metrics.jsonl"
  )


def test_one_step_with_jax_sampler_updates_and_syncs(tiny, one_device_learner):
  cfg, params, tok = tiny
  lrn = one_device_learner(cfg, params, 1e-3, rl=RL, pad_id=tok.pad_token_id)
  sampler = JaxSampler(cfg, params, tok)
  m = rollout.rl_step(lrn, plain.Plain(PROMPTS, seed=0), _ctx(sampler, tok, even_length), 0)
  assert int(lrn.state.step) == 1 and sampler.version == 1
  assert sampler._params is lrn.state.params
  for key in (
    "reward_mean",
    "accuracy",
    "solve_all",
    "solve_none",
    "entropy",
    "response_len_mean",
    "response_len_max",
    "truncated_frac",
    "clip_frac_low",
    "clip_frac_high",
    "grad_norm",
    "mismatch_abs",
    "tokens_per_s",
    "time_sample",
    "time_score",
    "time_buffer",
    "time_update",
    "time_sync",
    "time_step",
  ):
    assert key in m and np.isfinite(m[key]), key
  assert m["groups_kept"] == 4 and m["mismatch_abs"] < 1e-4  # same weights sampled and learned


def test_one_step_with_vllm_sampler_syncs_weights(
  vllm_server, served_model_dir, tmp_path, one_device_learner
):
  from rlvr.sampling.vllm_sampler import VLLMSampler

  cfg, params = model.load_hf(served_model_dir)
  tok = AutoTokenizer.from_pretrained(served_model_dir)
  lrn = one_device_learner(cfg, params, 1e-2, rl=RL, pad_id=tok.pad_token_id)
  sampler = VLLMSampler(
    vllm_server.url,
    model_config=cfg,
    eos_token_id=tok.eos_token_id,
    sync_dir=str(tmp_path / "sync"),
  )
  try:
    # The session's server is shared: other tests may have left their weights on it.
    sampler.update_weights(lrn.state.params, version=0)
    m = rollout.rl_step(lrn, plain.Plain(PROMPTS, seed=0), _ctx(sampler, tok, even_length), 0)
    assert sampler.version == 1 and m["groups_kept"] == 4
    assert m["mismatch_abs"] < 1e-3  # vLLM's logprobs vs the learner's, before the update
    info = sampler._session().get(vllm_server.url + "/weight_info").json()
    assert info["weight_version"] == "1"
    # the server now serves the updated policy
    from test_vllm_sampler import _our_logprobs

    from rlvr.sampling import SamplingParams

    out = sampler.generate([[5, 6, 7]], SamplingParams(n=1, max_tokens=8, seed=3, ignore_eos=True))[
      0
    ][0]
    new = jax.device_get(lrn.state.params)
    np.testing.assert_allclose(
      out.logprobs, _our_logprobs(new, cfg, [5, 6, 7], out.token_ids), atol=1e-3
    )
  finally:
    sampler.update_weights(params, version=2)  # leave the shared server as we found it
    sampler.close()


# The method lives in tests/, not in rlvr/: the seam needs no library edit.
_RUN = [
  "--config.sft.steps=30",
  "--config.data.arithmetic.n_heldout=32",
  "--config.eval.sampling.n=2",
  "--config.rl.loop.dynamic_sampling=False",
  "--config.rl.loop.prompts_per_step=4",
  "--config.checkpoint.every=2",
  "--config.export_hf=False",
  "--config.method=counting_method:make",
]


def _launch(workdir, *flags):
  out = tiny_run.launch(workdir, *_RUN, *flags)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _tensorboard_steps(workdir, tag="accuracy") -> list[int]:
  return [
    step for step, _ in run_output.tensorboard_scalars(os.path.join(workdir, "tensorboard"))[tag]
  ]


@pytest.mark.slow
def test_method_from_outside_the_library_stops_on_sigterm_and_resumes_with_its_state(tmp_path):
  _, full = tiny_run.train(tmp_path / "full", *_RUN, "--config.rl.steps=4")
  # The same command, stopped by SIGTERM once its first RL step is logged: it ends the
  # step in progress, saves a checkpoint there and exits non-zero; the rerun resumes.
  # It starts from the full run's SFT and evaluation before RL (same seeds, same output).
  cut = tmp_path / "cut"
  run_copies.start_from_sft(tmp_path / "full", cut)
  proc = subprocess.Popen(
    tiny_run.argv(cut, *_RUN, "--config.rl.steps=4"),
    cwd=REPO,
    env=tiny_run.env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  rows = cut / "metrics.jsonl"
  while proc.poll() is None and not (rows.exists() and rows.read_text().count("\n") >= 1):
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  err = proc.communicate(timeout=600)[1].decode()  # bytes: text mode would make \r a newline
  assert rows.exists(), err[-3000:]  # it ended before its first RL step: say why
  stopped_at = len(rows.read_text().splitlines())
  assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert f"stopped by SIGTERM after RL step {stopped_at} of 4" in err and stopped_at < 4
  assert "rerun the same command to resume" in err
  # Both lines print above the progress bar, not into it: the bar stays one line.
  screen = run_output.screen(err)
  assert sum(line.startswith("counting:") for line in screen) == 1, screen[-8:]
  assert (
    "SIGTERM: finishing this RL step, then saving a checkpoint (signal again to stop at once)"
    in screen
  ), screen[-8:]
  assert any(line.startswith(f"stopped by SIGTERM after RL step {stopped_at} ") for line in screen)
  out = _launch(cut, "--config.rl.steps=4")
  resumed = tiny_run.rows(cut / "metrics.jsonl", timing=True)
  assert [r["step"] for r in resumed] == [0, 1, 2, 3]
  assert _tensorboard_steps(cut) == [0, 1, 2, 3]
  # The end of the run in a few short lines; per-step lists stay in summary.json.
  assert f"resumed counting from step {stopped_at}\n" in out.stdout
  lines = out.stdout.strip().splitlines()
  assert lines[-2:] == [
    "counting: counting_total_calls 4",
    f"summary: {cut}/summary.json (all figures and per-step lists; plots: training.png, "
    "pass_at_k.png and the method's own .png beside it)",
  ], lines
  rate = r"\d+\.\d% -> \d+\.\d%"
  assert re.fullmatch(
    rf"heldout: pass@1 {rate}, pass@2 {rate}(, well-formed {rate})? \(before -> after RL\)",
    lines[-3],
  )
  assert lines[-4].startswith("RL: 4 steps of counting (")
  # Short lines, whatever the length of the paths they name.
  short = [line.replace(str(cut), "DIR").replace(os.path.expanduser("~"), "~") for line in lines]
  assert max(map(len, short)) < 200, short
  # The method's own counter and data position continue where the first invocation stopped.
  assert [r["counting_calls"] for r in resumed] == [1, 2, 3, 4]
  assert [r["counting_position"] for r in resumed] == [4, 8, 12, 16]
  for a, b in zip(full[stopped_at:], resumed[stopped_at:]):
    for k in a:
      if not k.startswith(tiny_run.TIMING):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
  summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
  assert summary["method"] == "counting" and summary["counting_total_calls"] == 4
  assert (tmp_path / "cut" / "counting.png").exists()
  # A rerun of the finished run draws no bar of the steps done before and logs nothing again.
  again = _launch(cut, "--config.rl.steps=4")
  assert "RL: done before, all 4 steps" in again.stdout and "counting:" not in again.stderr
  assert tiny_run.rows(cut / "metrics.jsonl", timing=True) == resumed
  assert _tensorboard_steps(cut) == [0, 1, 2, 3]


def test_sigterm_during_evaluation_stops_with_one_line(tmp_path):
  """Outside a training step (here: the evaluation before RL), SIGTERM abandons the phase
  and says so in one line, exit 128 + 15, no traceback."""
  import threading

  cmd = tiny_run.argv(
    tmp_path,
    "--config.sft.steps=0",
    "--config.data.arithmetic.n_sft=0",
    "--config.data.arithmetic.n_heldout=256",
    "--config.eval.sampling.n=4",
    "--config.eval.sampling.batch_prompts=16",
  )
  proc = subprocess.Popen(
    cmd, cwd=REPO, env=tiny_run.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
  )
  err = bytearray()
  reader = threading.Thread(
    target=lambda: [err.extend(c) for c in iter(lambda: proc.stderr.read(1), b"")], daemon=True
  )
  reader.start()
  deadline = time.time() + 600
  while b"eval seed" not in err and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=120)
  reader.join(timeout=10)
  text = err.decode(errors="replace")
  assert proc.returncode == 128 + signal.SIGTERM, text[-3000:]
  assert "stopped by SIGTERM outside a training step" in text and "rerun the same command" in text
  assert "Traceback" not in text
  assert not (tmp_path / "eval_before_rl").exists()  # nothing half-written
