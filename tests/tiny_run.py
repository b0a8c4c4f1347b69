"""Starting a `launch.*` run from a test: the one way every test does it.

    out, rows = tiny_run.train(tmp_path / "run", "--config.rl.steps=2")

runs `python -m launch.train --config=configs/tiny_rlvr.py --workdir=... <flags>` from the
repository root on CPU JAX, with tests/ on PYTHONPATH (echo_env, counting_method and the
other helpers a run names), and returns its output and its metrics.jsonl rows. `argv` and
`env` give the same command and environment to a test that starts the process itself
(Popen, to kill it); `launch` returns the finished process whatever its exit code;
`config` builds a config in-process, as `launch.train` does from its flags.

Runs of the same shapes share their compiled programs: the session's subprocesses use one
XLA compilation cache (conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from paths import REPO, TESTS

TINY_CONFIG = "configs/tiny_rlvr.py"
# XLA without its costly optimizations, for the pytest processes (conftest.py): their tests
# compile hundreds of programs of tiny models, whose compile time is most of their time. On
# 2 cores of an AMD EPYC, tests/learner/test_lora_rl.py takes 116 s with these flags and
# 183 s without. A whole run computes for longer than it compiles (its sampler decodes token
# by token), and its programs come from the shared cache after the first: the runs the tests
# start compile as a user's run does (`env`).
QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
TIMING = ("time_", "tokens_per_s")
_PROCESS_SETTINGS = (
  "RLVR_COORDINATOR",
  "RLVR_NUM_PROCESSES",
  "RLVR_PROCESS_ID",
  "RLVR_HEARTBEAT_S",
)  # metrics that are wall-clock figures, different every run

# The smallest run of configs/tiny_rlvr.py that still trains and evaluates: no SFT, 8
# problems, one group of 2 x 4 responses of 8 tokens, raw prompts.
RAW_PROMPTS_RUN = [
  "--config.sft.steps=0",
  "--config.data.arithmetic.n_sft=0",
  "--config.data.arithmetic.n_train=8",
  "--config.data.arithmetic.n_heldout=2",
  "--config.rl.loop.prompts_per_step=2",
  "--config.rl.loop.group_size=4",
  "--config.rl.loop.max_prompt_len=8",
  "--config.rl.loop.max_response_len=8",
  "--config.rl.loop.dynamic_sampling=False",
  "--config.eval.sampling.n=2",
  "--config.eval.sampling.max_tokens=8",
  "--config.data.chat_template=none",
]


def env(*paths, devices: int | None = None, **extra) -> dict:
  """The environment of a child run: this one's without a multi-process run's settings
  (RLVR_COORDINATOR, ...), CPU JAX (`devices` fake CPU devices if given), `paths` and tests/
  on PYTHONPATH, then `extra`. XLA's default optimizations (without the suite's
  `QUICK_COMPILE`), as a user's run compiles."""
  base = {k: v for k, v in os.environ.items() if k not in _PROCESS_SETTINGS}
  xla = [f for f in base.get("XLA_FLAGS", "").split() if f not in QUICK_COMPILE.split()]
  base["XLA_FLAGS"] = " ".join(xla)
  python_path = [str(p) for p in paths] + [TESTS, REPO, base.get("PYTHONPATH", "")]
  base.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(p for p in python_path if p))
  if devices is not None:  # after the XLA flags above
    flags = [
      *base.get("XLA_FLAGS", "").split(),
      f"--xla_force_host_platform_device_count={devices}",
    ]
    base["XLA_FLAGS"] = " ".join(flags)
  return dict(base, **extra)


def argv(workdir, *flags, config: str | None = TINY_CONFIG, module: str = "launch.train"):
  """`python -m <module> [--config=<config>] --workdir=<workdir> <flags>`."""
  head = [sys.executable, "-m", module] + ([f"--config={config}"] if config else [])
  return [*head, f"--workdir={workdir}", *flags]


def launch(workdir, *flags, environ: dict | None = None, timeout: float = 900, **kw):
  """The finished run (a CompletedProcess with text output), whatever its exit code."""
  return subprocess.run(
    argv(workdir, *flags, **kw),
    cwd=REPO,
    env=environ if environ is not None else env(),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def train(workdir, *flags, **kw):
  """The run to a clean exit: (its stdout + stderr, its metrics.jsonl rows)."""
  out = launch(workdir, *flags, **kw)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout + out.stderr, rows(os.path.join(workdir, "metrics.jsonl"), timing=True)


def rows(path, timing: bool = False) -> list[dict]:
  """A metrics.jsonl file's rows; timing=False drops the wall-clock figures, so two runs of
  the same work compare equal."""
  with open(path) as f:
    out = [json.loads(line) for line in f]
  if timing:
    return out
  return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in out]


def config(name: str = "tiny_rlvr", *overrides: str):
  """configs/<name>.py with `--config.x=...` overrides, as launch/train.py builds it."""
  from absl import flags
  from ml_collections import config_flags

  argv = ["train", f"--config={os.path.join(REPO, 'configs', name + '.py')}", *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  fv(argv)
  return fv.config
