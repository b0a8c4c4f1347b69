"""Out of memory ends a run with one line: the phase, the size XLA asked for, what to lower.

A real `launch.train` run whose RL update cannot fit (256 rows of 2,016 tokens without
remat: XLA's CPU buffer assignment asks for 108.8 GiB of temporaries in one allocation,
what `bench/plan.py` reports for the same flags) on a machine of a few tens of GiB:
XLA refuses the allocation at once, nothing is touched or swapped. An address-space
limit on the child makes sure of that even where the kernel overcommits memory.
"""

from __future__ import annotations

import re
import resource
import subprocess
import time

import jax
import jax.numpy as jnp
import pytest
import tiny_run
from paths import REPO

from rlvr.run import oom

# One CPU device whatever the caller's XLA_FLAGS say: the whole update on one device.
ONE_DEVICE = tiny_run.env(TOKENIZERS_PARALLELISM="false", JAX_NUM_CPU_DEVICES="1")
ONE_DEVICE.pop("XLA_FLAGS", None)
GIB = 1024**3

# tiny_rlvr scaled down (no SFT, 8 held-out problems, 1 RL step of 8-token responses) but
# with an update of 32 groups x 8 responses padded to 2000 + 8 positions (the tiny model
# has 2048), every group kept (no dynamic sampling) and updated in one step.
TOO_BIG = [
  "--config.sft.steps=0",
  "--config.data.arithmetic.n_heldout=8",
  "--config.eval.sampling.n=2",
  "--config.eval.sampling.max_tokens=8",
  "--config.rl.steps=1",
  "--config.rl.loop.dynamic_sampling=False",
  "--config.rl.learner.micro_batches=1",  # the automatic count would split it until it fits
  "--config.rl.learner.ppo_mini_batch_size=0",
  "--config.rl.loop.prompts_per_step=32",
  "--config.rl.loop.max_prompt_len=2000",
  "--config.rl.loop.max_response_len=8",
]

EXPECTED = re.compile(
  re.escape(
    "launch.train: out of memory in the RL update (XLA could not allocate SIZE GiB): use "
    "more, smaller micro-batches (lower rl.learner.micro_memory_gb, or set "
    "rl.learner.micro_batch_rows / micro_batches), set rl.learner.remat=True, lower rl.loop.max_response_len / "
    "max_prompt_len, rl.loop.prompts_per_step (or rl.learner.ppo_mini_batch_size), or use more "
    "devices (mesh); python bench/plan.py --config=configs/tiny_rlvr.py --devices=1 (with "
    "the same --config.* flags) tells what fits before a run (--verbose for the traceback)"
  ).replace("SIZE", r"(\d+\.\d)")
  + "$"
)


def _limit_address_space():
  limit = 16 * GIB  # far below the update's 108.8 GiB, far above what the run uses (~1.4)
  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.slow
def test_rl_update_out_of_memory_is_one_line(tmp_path):
  t0 = time.time()
  p = subprocess.run(  # not tiny_run.launch: the child's address space is limited
    tiny_run.argv(tmp_path / "run", *TOO_BIG),
    cwd=REPO,
    env=ONE_DEVICE,
    capture_output=True,
    text=True,
    timeout=300,
    preexec_fn=_limit_address_space,
  )
  seconds = time.time() - t0
  last = p.stderr.replace("\r", "\n").strip().splitlines()[-1]
  assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
  m = EXPECTED.match(last)
  assert m, last
  assert float(m.group(1)) > 100, last  # far beyond this machine: refused, never swapped
  assert "Traceback" not in p.stderr and "RESOURCE_EXHAUSTED" not in p.stderr
  assert seconds < 240, seconds  # set-up, eval, one rollout, compile: ~25 s on 2 cores


@pytest.mark.slow
def test_evaluate_out_of_memory_is_one_line(tmp_path):
  """launch.evaluate of tiny_rlvr's model: 256 prompts x 64 samples x 2,000 tokens in one
  generate call (144 GiB)."""
  from configs import tiny_rlvr
  from rlvr.run import workdir

  model_dir = workdir.prepare_model(
    tiny_rlvr.get_config().model
  )  # cached, as launch.train makes it
  p = subprocess.run(
    tiny_run.argv(
      tmp_path / "eval",
      f"--model={model_dir}",
      "--data=arithmetic",
      "--limit=256",
      "--n=64",
      "--max_tokens=2000",
      "--batch_prompts=256",
      config=None,
      module="launch.evaluate",
    ),
    cwd=REPO,
    env=ONE_DEVICE,
    capture_output=True,
    text=True,
    timeout=300,
    preexec_fn=_limit_address_space,
  )
  last = p.stderr.replace("\r", "\n").strip().splitlines()[-1]
  assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
  m = re.fullmatch(
    r"launch\.evaluate: out of memory in evaluation \(XLA could not allocate "
    r"(\d+\.\d) GiB\): lower --batch_prompts, --max_tokens or --n",
    last,
  )
  assert m and float(m.group(1)) > 100, last
  assert "Traceback" not in p.stderr


# ------------------------------------------------------------------ the classifier
@pytest.fixture(scope="module")
def xla_oom():
  """A real XLA out-of-memory error: 256 TiB, beyond any x86-64 address space."""
  f = jax.jit(lambda x: jnp.sort((x[:, None] * x[None, :]).reshape(-1))[:3])
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    f(jnp.ones(2**23)).block_until_ready()
  assert "RESOURCE_EXHAUSTED" in str(info.value)
  return info.value


def _called_from(modules, exc):
  """Raises exc from a chain of calls made in these modules, outermost first."""

  def leaf():
    raise exc.with_traceback(None)

  fn = leaf
  for name in reversed(modules):
    g = {"__name__": name, "inner": fn}
    exec("def call():\n  return inner()\n", g)
    fn = g["call"]
  try:
    fn()
  except BaseException as e:  # noqa: BLE001
    return e
  raise AssertionError("not raised")


@pytest.mark.parametrize(
  "modules, phase",
  [
    (
      ["rlvr.run.runner", "rlvr.rollout.step", "rlvr.learner.ppo", "rlvr.learner.update"],
      "RL update",
    ),
    (
      ["rlvr.run.runner", "rlvr.rollout.step", "rlvr.methods.svs", "rlvr.sampling.jax_sampler"],
      "sampling",
    ),
    (["rlvr.run.runner", "rlvr.run.evaluation", "rlvr.sampling.jax_sampler"], "evaluation"),
    (["rlvr.run.runner", "rlvr.run.sft", "rlvr.learner.update"], "SFT"),
    (["rlvr.run.runner", "rlvr.run.checkpoint"], None),
  ],
)
def test_phase_is_read_off_the_traceback(xla_oom, modules, phase):
  e = _called_from(modules, xla_oom)
  assert oom.phase_of(e) == phase
  line = oom.describe(e, plan="python bench/plan.py --config=C")
  where = {
    "RL update": " in the RL update",
    "sampling": " in sampling (the RL rollouts)",
    None: "",
  }.get(phase, f" in {phase}")
  assert line.startswith(
    f"out of memory{where} (XLA could not allocate 256.0 TiB): {oom.ADVICE[phase]}"
  ), line
  assert line.endswith("tells what fits before a run") == (phase in ("RL update", None))
  assert "\n" not in line


def test_other_errors_are_not_out_of_memory(xla_oom):
  assert oom.describe(ValueError("Out of memory in a message")) is None
  assert oom.describe(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes")) is None
  host = MemoryError("Unable to allocate 29.9 GiB for an array with shape (8, 1000000000)")
  assert oom.describe(host, "SFT", "lower --batch_size") == (
    "out of memory in SFT (the host could not allocate 29.9 GiB): lower --batch_size"
  )


def test_reported_exits_with_one_line(xla_oom, capsys):
  with pytest.raises(SystemExit) as info:
    with oom.reported("launch.evaluate", "evaluation", "lower --batch_prompts"):
      raise xla_oom.with_traceback(None)
  assert info.value.code == 1
  assert capsys.readouterr().err == (
    "launch.evaluate: out of memory in evaluation (XLA could "
    "not allocate 256.0 TiB): lower --batch_prompts\n"
  )
  with pytest.raises(KeyError):  # anything else passes through
    with oom.reported("launch.evaluate", "evaluation", "lower --batch_prompts"):
      raise KeyError("x")
