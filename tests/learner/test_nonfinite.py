"""A loss or gradient that is not finite: the update is not applied (parameters, moments,
step count and rng as they were), the learner raises one line saying what was not finite
and where it came from, and a run stops there with its last good checkpoint kept."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tiny_run

from rlvr import learner, model, rollout
from rlvr.run import checkpoint_integrity
from rlvr.sampling.types import Completion

RL = rollout.RLConfig(prompts_per_step=2, group_size=4, max_prompt_len=8, max_response_len=8)
LR = 1e-2


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
  return model.load_hf(tiny_dirs["qwen2"])


def _groups(rewards):
  """Two groups of four fixed responses to two prompts, with these rewards."""
  groups = []
  for g, r in enumerate(rewards):
    completions = [
      Completion(tuple(10 + g + i + t for t in range(3 + i)), (-1.0,) * (3 + i), "", "stop")
      for i in range(RL.group_size)
    ]
    prompt = rollout.Prompt((5 + g, 6 + g, 7 + g), "0")
    groups.append(rollout.Group(prompt, completions, np.array(r, np.float32), np.array(r) > 0))
  return groups


GOOD = [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0]]
NAN = [[0.0, float("nan"), 0.0, 1.0], [1.0, 0.0, 0.0, 1.0]]


def _host(state):
  return jax.tree.leaves(jax.device_get((state.params, state.opt_state, state.step, state.rng)))


def _unchanged(a, b):
  return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))


def test_nan_advantages_leave_the_state_and_say_so(tiny, one_device_learner):
  cfg, params = tiny
  lrn = one_device_learner(cfg, params, LR, rl=RL, micro_batches=1)
  lrn.update(_groups(GOOD), step=0)  # moments and step count that are not zeros
  before = _host(lrn.state)
  with pytest.raises(learner.NonFiniteError) as e:
    lrn.update(_groups(NAN), step=1)
  print(e.value)
  assert str(e.value) == (
    "the loss is not finite (nan): the advantages are nan at row 0; that update was not applied"
  )
  assert isinstance(e.value, ValueError)  # launch.train: one line, exit 1
  assert _unchanged(_host(lrn.state), before)
  m = lrn.update(_groups(GOOD), step=1)  # the state the learner kept is whole
  assert int(lrn.state.step) == 2 and np.isfinite(m["loss"]) and "nonfinite_grad_leaf" not in m


def test_a_parameter_that_is_not_finite_is_named(tiny, one_device_learner):
  cfg, params = tiny
  params = jax.tree.map(np.array, params)
  params["layers"]["mlp"]["up_kernel"][1, 3, 5] = np.inf
  lrn = one_device_learner(cfg, params, LR, rl=RL, micro_batches=1)
  before = _host(lrn.state)
  with pytest.raises(learner.NonFiniteError) as e:
    lrn.update(_groups(GOOD), step=0)
  print(e.value)
  assert str(e.value).startswith(
    "the loss is not finite (nan): the parameters are not finite before the update "
    "(layers/mlp/up_kernel: inf)"
  )
  assert _unchanged(_host(lrn.state), before)


def test_a_gradient_that_is_not_finite_under_a_finite_loss_is_named(tiny, one_device_learner):
  """Weights 1e29 times the reference's: the forward pass and the KL term stay finite (the
  norms rescale), their gradient does not."""
  cfg, params = tiny
  lrn = one_device_learner(cfg, params, LR, rl=RL, micro_batches=1, kl_beta=1.0)
  lrn.state = lrn.state.replace(params=jax.tree.map(lambda p: p * -1e29, lrn.state.params))
  before = _host(lrn.state)
  with pytest.raises(learner.NonFiniteError) as e:
    lrn.update(_groups(GOOD), step=0)
  print(e.value)
  assert str(e.value).startswith("the gradient norm is not finite (")
  assert ": first in the gradient of " in str(e.value)
  assert _unchanged(_host(lrn.state), before)


def test_mini_batches_name_the_optimizer_step_not_applied(tiny, one_device_learner):
  cfg, params = tiny
  lrn = one_device_learner(cfg, params, LR, rl=RL, micro_batches=1, ppo_mini_batch_size=1)
  with pytest.raises(learner.NonFiniteError) as e:
    lrn.update(_groups(NAN), step=0)
  print(e.value)
  assert str(e.value).startswith("optimizer step ")
  assert " of 2: the loss is not finite (nan): the advantages are nan at row 0" in str(e.value)
  assert int(lrn.state.step) == 1  # the other mini-batch's step was applied, this one not
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(lrn.state.params)))


def test_run_stops_at_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
  """A huge learning rate with weight decay blows the weights up after RL step 1 (its
  gradient is zero: no reward signal); RL step 2's KL gradient is NaN."""
  workdir = tmp_path / "run"
  out = tiny_run.launch(
    workdir,
    *tiny_run.RAW_PROMPTS_RUN,
    "--config.rl.steps=3",
    "--config.checkpoint.every=1",
    "--config.rl.learner.learning_rate=1e30",
    "--config.rl.learner.weight_decay=1.0",
    "--config.rl.learner.kl_beta=1.0",
  )
  last = out.stderr.strip().splitlines()[-1]
  print(out.returncode, last)
  ckpts = str(workdir / "checkpoints")
  assert out.returncode == 1
  assert last.startswith("launch.train: RL step 2 of 3: the gradient norm is not finite (nan)")
  assert last.endswith(
    "; that update was not applied; nothing of this step was saved, the last good "
    f"checkpoint is step 1 in {ckpts} (--verbose for the traceback)"
  )
  assert "Traceback" not in out.stderr
  assert (
    checkpoint_integrity.steps(ckpts) == [1]
    and checkpoint_integrity.verify(os.path.join(ckpts, "1")) is None
  )
  saved = ocp.StandardCheckpointer().restore(os.path.join(ckpts, "1", "state"))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(saved["params"]))
  with open(workdir / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [0]
