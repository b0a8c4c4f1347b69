"""Whole runs on two processes (JAX's multi-controller runtime over gloo, 1 CPU device
each) against one process with 2 devices: SFT, evaluation, RL (plain GRPO and SvS),
checkpoints, HF export; a killed process; work dirs that are not shared."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import run_copies
import tiny_run
from paths import REPO

pytestmark = pytest.mark.slow

SMALL = [
  "--config.sft.steps=60",
  "--config.data.arithmetic.n_heldout=16",
  "--config.eval.sampling.n=2",
  "--config.checkpoint.every=1",
]
PLAIN = ["--config=configs/tiny_rlvr.py", "--config.rl.steps=3", *SMALL]
# The embedded SvS config without its SFT on inverse pairs: its SFT and held-out settings are
# the plain config's, so its runs start from the plain one-process run's SFT and evaluation.
SVS = [
  "--config=configs/tiny.py",
  "--config.data.arithmetic.inverse_pairs=False",
  "--config.rl.steps=1",
  *SMALL,
]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _one_process(flags, workdir):
  tiny_run.train(workdir, *flags, config=None, environ=tiny_run.env(devices=2))


def _start_two(flags, workdirs, log_dir):
  """Two processes of one run; workdirs[i] for process i."""
  port = _free_port()
  procs = []
  for i in (0, 1):
    # Heartbeat 60 s: 10 s, and once 30 s, declared a live process dead while XLA compiled
    # on 2 cores shared with a vLLM server and another test's run. Unbuffered: a test waits
    # for a line of the log.
    env = tiny_run.env(
      devices=1,
      RLVR_COORDINATOR=f"localhost:{port}",
      RLVR_NUM_PROCESSES="2",
      RLVR_PROCESS_ID=str(i),
      RLVR_HEARTBEAT_S="60",
      PYTHONUNBUFFERED="1",
    )
    log = open(os.path.join(log_dir, f"process{i}.log"), "w")
    procs.append(
      subprocess.Popen(
        tiny_run.argv(workdirs[i], *flags, config=None),
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )
    )
  return procs


def _wait(procs, log_dir, timeout=900):
  codes = [p.wait(timeout=timeout) for p in procs]
  logs = [open(os.path.join(log_dir, f"process{i}.log")).read() for i in (0, 1)]
  return codes, logs


def _two_processes(flags, workdir, log_dir):
  codes, logs = _wait(_start_two(flags, [workdir, workdir], log_dir), log_dir)
  assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
  return logs


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
  """The tiny plain-GRPO config, 3 RL steps, on 1 process x 2 devices: the reference."""
  one = tmp_path_factory.mktemp("multihost_plain") / "one"
  _one_process(PLAIN, one)
  return one


def _both_logs(log) -> str:
  """The ends of both processes' logs (`log` is process 0's), for a failure message."""
  other = log.with_name("process1.log")
  return "\n".join(f"--- {p.name}:\n{p.read_text()[-3000:]}" for p in (log, other))


def _wait_for_rows(procs, metrics, n, log):
  deadline = time.time() + 600
  while time.time() < deadline and not (metrics.exists() and len(tiny_run.rows(metrics)) >= n):
    assert procs[0].poll() is None, _both_logs(log)
    time.sleep(0.2)


def _wait_for_line(procs, log, text):
  deadline = time.time() + 600
  while time.time() < deadline and text not in open(log).read():
    assert procs[0].poll() is None, _both_logs(log)
    time.sleep(0.2)


def test_two_processes_stopped_twice_end_where_one_process_does(one_process_run, tmp_path):
  """The plain config on 2 processes x 1 device from scratch. SLURM preemption signals
  processes at slightly different times: they agree on the step to stop after, save one
  checkpoint together and exit 143. The rerun resumes from it; one of its processes killed
  (SIGKILL) stops the other within the heartbeat bound; the next rerun resumes again. The
  run then holds what the one-process run holds: per-step SFT and RL metrics, evaluations
  and the exported HF model's bytes (per-prompt sampling seeds, the same global program;
  gloo's reductions agree here)."""
  one, workdir = one_process_run, tmp_path / "run"
  reference = tiny_run.rows(one / "metrics.jsonl")
  metrics, log = workdir / "metrics.jsonl", tmp_path / "process0.log"
  procs = _start_two(PLAIN, [workdir, workdir], tmp_path)
  _wait_for_rows(procs, metrics, 1, log)
  procs[1].send_signal(signal.SIGTERM)
  codes, logs = _wait(procs, tmp_path, timeout=300)
  assert codes == [143, 143], logs[0][-2000:]
  assert "stopped by SIGTERM after RL step" in logs[0] + logs[1]
  # Each process says who it is and which mesh it built.
  assert "process 0 of 2: global mesh {'data': 1, 'fsdp': 2, 'expert': 1, 'tensor': 1}" in logs[0]
  assert "process 1 of 2" in logs[1]
  assert tiny_run.rows(workdir / "sft" / "metrics.jsonl") == tiny_run.rows(
    one / "sft" / "metrics.jsonl"
  )
  done = tiny_run.rows(metrics)
  assert 1 <= len(done) < 3 and done == reference[: len(done)]
  steps = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert steps[-1] == len(done)  # one checkpoint, at the step both stopped after

  procs = _start_two(PLAIN, [workdir, workdir], tmp_path)
  _wait_for_line(procs, log, f"resumed rlvr from step {len(done)}")
  procs[1].send_signal(signal.SIGKILL)
  killed_at = time.time()
  assert procs[0].wait(timeout=300) != 0
  assert time.time() - killed_at < 240  # bounded: heartbeat 60 s, then an error
  procs[1].wait()

  _two_processes(PLAIN, workdir, tmp_path)
  assert "resumed rlvr from step" in open(log).read()
  assert tiny_run.rows(metrics) == reference
  assert [r["step"] for r in reference] == [0, 1, 2]
  s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, workdir))
  for key in ("eval_before_rl", "eval_after_rl"):
    assert s1[key] == s2[key]
  for name in ("model.safetensors", "config.json"):
    assert (workdir / "policy" / name).read_bytes() == (one / "policy" / name).read_bytes()
  # Only process 0 wrote files.
  assert not [f for f in os.listdir(workdir) if f.startswith(".shared-check")]


def test_work_dirs_that_are_not_shared_are_an_error_at_start_up(tmp_path):
  procs = _start_two(PLAIN, [tmp_path / "a", tmp_path / "b"], tmp_path)
  codes, logs = _wait(procs, tmp_path, timeout=300)
  assert codes[0] != 0 and codes[1] != 0
  assert "do not see the file process 0 wrote" in logs[0] + logs[1]
  assert "shared file system" in logs[1]


def test_one_svs_step_on_two_processes_equals_one_process(one_process_run, tmp_path):
  """The SvS step on 2 processes and on 1, both from the plain one-process run's SFT and
  evaluation (SFT itself on 2 processes: the plain config's test)."""
  one, two = tmp_path / "one", tmp_path / "two"
  run_copies.start_from_sft(one_process_run, one)
  run_copies.start_from_sft(one_process_run, two)
  _one_process(SVS, one)
  _two_processes(SVS, two, tmp_path)
  rows = tiny_run.rows(two / "metrics.jsonl")
  assert rows == tiny_run.rows(one / "metrics.jsonl") and len(rows) == 1
  assert rows[0]["svs_syntheses"] > 0
  s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
  assert s1["eval_after_rl"] == s2["eval_after_rl"]


def test_episodes_and_lora_on_two_processes_equal_one_process(one_process_run, tmp_path):
  """Multi-turn episodes of an environment whose answers name the process computing them
  (tests/echo_env.py), with RL training LoRA adapters: two processes run an RL step and the
  evaluations before and after it as one process does, because both take process 0's
  observations, and they export the same adapter."""
  flags = [
    *PLAIN[:1],
    "--config.rl.steps=1",
    *SMALL,
    "--config.env.name=echo_env:per_process",
    "--config.env.max_turns=3",
    "--config.env.max_total_tokens=100",
    "--config.rl.loop.dynamic_sampling=False",  # the policy rarely solves a cut-up problem
    "--config.rl.learner.lora.rank=8",
    "--config.rl.learner.learning_rate=2e-3",
    "--config.shaping.overlong_cache=30",  # rewards that differ by length: the adapters move
  ]
  one, two = tmp_path / "one", tmp_path / "two"
  run_copies.start_from_sft(one_process_run, one, evaluated=False)
  run_copies.start_from_sft(one_process_run, two, evaluated=False)
  _one_process(flags, one)
  _two_processes(flags, two, tmp_path)
  rows = tiny_run.rows(two / "metrics.jsonl")
  assert rows == tiny_run.rows(one / "metrics.jsonl") and len(rows) == 1
  assert all(r["turns_mean"] > 1 and r["obs_tokens_frac"] > 0 for r in rows)
  assert all(r["entropy"] > 0 and r["grad_norm"] > 0 for r in rows)
  s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
  for key in ("eval_before_rl", "eval_after_rl"):
    assert s1[key] == s2[key]
  weights = "adapter_model.safetensors"
  assert (two / "policy_adapter" / weights).read_bytes() == (
    (one / "policy_adapter" / weights).read_bytes()
  )
  # The same adapter config, each naming its own run's SFT model as the base
  c1, c2 = (
    json.loads((d / "policy_adapter" / "adapter_config.json").read_text()) for d in (one, two)
  )
  for c, d in ((c1, one), (c2, two)):
    assert c.pop("base_model_name_or_path") == str(d / "sft" / "model")
  assert c1 == c2


def test_split_sampler_gives_every_process_the_one_process_rollout(
  vllm_server, served_model_dir, tmp_path
):
  """Each of two processes samples its slice on (here: the same) vLLM server; both get
  back every completion, equal to one process sampling all prompts (seeds by global index)."""
  from rlvr.model.config import ModelConfig
  from rlvr.sampling import SamplingParams
  from rlvr.sampling.vllm_sampler import VLLMSampler

  prompts = [[5, 6, 7], [300, 301, 302, 303], [40, 41], [9, 10, 11, 12, 13]]  # 2 + 2 split
  port = _free_port()
  worker = os.path.join(REPO, "tests", "split_sampler_worker.py")
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        worker,
        f"localhost:{port}",
        str(i),
        vllm_server.url,
        vllm_server.options.served_model_name,
        served_model_dir,
        str(tmp_path / f"out{i}.json"),
      ],
      env=tiny_run.env(devices=1, SPLIT_PROMPTS=json.dumps(prompts)),
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in (0, 1)
  ]
  errs = [p.communicate(timeout=300)[1] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
  got = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in (0, 1)]
  assert got[0] == got[1] and len(got[0]) == 4 and all(len(g) == 2 for g in got[0])
  cfg = ModelConfig.from_hf(served_model_dir)
  one = VLLMSampler(
    vllm_server.url,
    model_config=cfg,
    eos_token_id=cfg.eos_token_id,
    model_name=vllm_server.options.served_model_name,
  )
  want = one.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=7))
  one.close()
  for g_got, g_want in zip(got[0], want):
    for (ids, logps, text, finish), c in zip(g_got, g_want):
      assert ids == list(c.token_ids) and text == c.text and finish == c.finish_reason
      assert logps == pytest.approx(list(c.logprobs), abs=1e-6)
