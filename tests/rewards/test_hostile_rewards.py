"""A user's reward functions as hostile code: they run in the reward pool's workers, so a
hang, an exit, a fork, an edit of their arguments or a strange return value becomes a named
verdict, never the trainer's end, hang or corruption.

The functions are a real module imported from a temporary directory, run by the real
reward pool; the last test runs them through launch.train."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time

import numpy as np
import pytest
import tiny_run
from step_context import step_context

from rlvr import rollout
from rlvr.common import settings
from rlvr.rewards import RewardConfig, custom, custom_caller, custom_task
from rlvr.rewards.verifiers import open_verifier

HOSTILE = """
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def works(responses, answers, prompts):
  return [float(a in r) for r, a in zip(responses, answers)]


def hangs(responses, answers, prompts):
  time.sleep(3600)


def exits(responses, answers, prompts):
  os._exit(0)


def forks_and_answers(responses, answers, prompts):
  os.fork()  # both processes return: only the worker may answer
  return [2.0] * len(responses)


def forks_a_sleeper(responses, answers, prompts):
  pid = os.fork()
  if pid == 0:
    time.sleep(600)
    os._exit(0)
  with open(os.path.join(HERE, "sleeper.pid"), "w") as f:
    f.write(str(pid))
  return [1.0] * len(responses)


def endless(responses, answers, prompts):
  def values():
    while True:
      yield 1.0
  return values()


def pops_then_raises(responses, answers, prompts):
  responses.pop()
  if responses:  # a batch: fails, after editing its list
    raise ValueError("cannot score a batch")
  return [float(answers[0] == "1")]


def appends(completions, tags, **kwargs):
  for t in tags:
    t.append("seen")
  return [float(len(t)) for t in tags]


def with_grad(responses, answers, prompts):
  import torch

  w = torch.ones(len(responses), requires_grad=True)
  return w * torch.tensor([float(a in r) for r, a in zip(responses, answers)])


def zeros_with_grad(responses, answers, prompts):
  import torch

  return torch.zeros(len(responses), requires_grad=True) * 1.0


def grad_scalars(data_source, solution_str, ground_truth, extra_info=None):
  import torch

  return torch.tensor(1.0, requires_grad=True) * 0.5


def hangs_on_some(data_source, solution_str, ground_truth, extra_info=None):
  if "hang" in solution_str:
    time.sleep(3600)
  return {"score": 1.0, "x" * 100000: 2.0, "a\\nb\\x1b[31m": 3.0, "../../etc/loss": 4.0}


def hangs_verl(data_source, solution_str, ground_truth, extra_info=None):
  time.sleep(3600)
"""

TEXTS = ["so 1", "so 2", "so 3", "so 4"]
GOLDS = ["1", "2", "9", "4"]
PROBLEMS = ["p1", "p2", "p3", "p4"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
  root = tmp_path_factory.mktemp("hostile_code")
  (root / "hostile.py").write_text(HOSTILE)
  (root / "user_twin.py").write_text("def works(responses, answers, prompts):\n  return [0.0]\n")
  sys.path.insert(0, str(root))
  yield root
  sys.path.remove(str(root))
  sys.modules.pop("hostile", None)
  sys.modules.pop("user_twin", None)


def _open(*names, fn_timeout_s: float = 1.0):
  domain = ",".join(f"hostile:{n}" for n in names)
  return open_verifier(RewardConfig(domain=domain, fn_timeout_s=fn_timeout_s))


def _children() -> set[int]:
  """This process's children (the reward workers and their forkserver among them)."""
  me = os.getpid()
  kids = set()
  for d in os.listdir("/proc"):
    try:
      stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue
    if int(stat[1]) == me and stat[0] != "Z":
      kids.add(int(d))
  return kids


def test_a_hang_an_exit_and_an_endless_generator_are_verdicts_in_bounded_time(hostile):
  with _open("works", "hangs", "exits", "endless") as v:
    scored = v.score(TEXTS, GOLDS, PROBLEMS)
  rewards, correct = scored
  assert rewards.tolist() == [1.0, 1.0, 0.0, 1.0] and correct.tolist() == [1, 1, 0, 1]
  assert scored.counts["fn_timeout_hangs"] == 4 and scored.counts["fn_died_exits"] == 4
  assert scored.counts["fn_wrong_length_endless"] == 4
  assert scored.values["reward_fn_works"] == [1.0, 1.0, 0.0, 1.0]

  for name, why in (
    ("hangs", "took longer than reward.fn_timeout_s=1 s"),
    ("exits", "ended its reward worker process (an exit, a crash or a signal)"),
    ("endless", "returned more than 4 values for 4 responses"),
  ):
    with pytest.raises(custom_caller.RewardFunctionError) as e, _open(name) as v:
      v.score(TEXTS, GOLDS, PROBLEMS)
    assert str(e.value).startswith(
      f"reward.domain: hostile:{name} failed on all 4 responses of a scoring call: {why}; "
    ), str(e.value)


def test_a_verl_function_that_hangs_costs_its_responses_not_every_response_a_timeout(hostile):
  with _open("hangs_on_some") as v:
    rewards, _ = scored = v.score(TEXTS[:3] + ["hang"], GOLDS, PROBLEMS)
  assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0] and scored.counts["fn_timeout"] == 1
  # user keys as metric names: bounded, no control characters or paths
  assert sorted(scored.values) == [
    "reward_info_a_b_31m",
    "reward_info_etc_loss",
    "reward_info_" + "x" * custom.MAX_KEY,
  ]
  with _open("hangs_verl") as v:  # hangs on everything: the first calls tell, not all 8
    with pytest.raises(custom_caller.RewardFunctionError, match="the other 6 were not tried"):
      v.score(TEXTS * 2, GOLDS * 2, PROBLEMS * 2)


def test_a_fork_neither_duplicates_the_trainer_nor_outlives_the_pool(hostile):
  before = _children()
  with _open("forks_and_answers") as v:
    rewards, _ = v.score(TEXTS, GOLDS, PROBLEMS)
  assert rewards.tolist() == [2.0] * 4  # one answer per call, the worker's
  with _open("forks_a_sleeper") as v:
    assert v.score(TEXTS, GOLDS, PROBLEMS)[0].tolist() == [1.0] * 4
    pid = int((hostile / "sleeper.pid").read_text())
    assert pid not in _children()  # the fork is the worker's child, not this process's
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline and _alive(pid):
    time.sleep(0.1)
  assert not _alive(pid), "a process a reward function forked outlived the pool"
  assert _children() - before <= _multiprocessing_helpers(), _children() - before


def _alive(pid: int) -> bool:
  try:
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


def _multiprocessing_helpers() -> set[int]:
  """This process's forkserver and resource tracker, which the first pool starts and which
  outlive it (multiprocessing's own, one each per process)."""
  from multiprocessing import forkserver, resource_tracker

  pids = (
    getattr(forkserver._forkserver, "_forkserver_pid", None),
    getattr(resource_tracker._resource_tracker, "_pid", None),
  )
  return {pid for pid in pids if pid}


def test_each_call_gets_its_own_copies_of_its_arguments(hostile, tmp_path):
  with _open("pops_then_raises") as v:  # the batch raised after a pop: retried one by one
    rewards, _ = scored = v.score(["a", "b", "c", "d"], ["1", "1", "2", "1"], PROBLEMS)
  assert rewards.tolist() == [1.0, 1.0, 0.0, 1.0] and scored.counts["scored"] == 4

  from rlvr.data import readers

  path = tmp_path / "train.jsonl"
  path.write_text(json.dumps({"question": "p1", "answer": "1", "tags": ["x"]}) + "\n")
  examples = readers.read_dataset(str(path)).examples
  with _open("appends") as v:
    v.check_answers(examples, "data.train_path")
    for _ in range(3):  # a row's list column as the data holds it, every call
      assert v.score(["a", "b"], ["1", "1"], ["p1", "p1"])[0].tolist() == [2.0, 2.0]
  assert examples[0].columns["tags"] == ["x"]


def test_tensors_with_a_graph_are_values(hostile):
  with _open("with_grad", fn_timeout_s=120) as v:  # the first call imports torch
    assert v.score(TEXTS, GOLDS, PROBLEMS)[0].tolist() == [1.0, 1.0, 0.0, 1.0]
  with _open("grad_scalars", fn_timeout_s=120) as v:
    assert v.score(TEXTS, GOLDS, PROBLEMS)[0].tolist() == [0.5] * 4
  for value in (object(), "1", [1.0], float("nan"), 1e39):
    assert custom_task._number(value) is None


def test_weights_are_finite_and_names_distinct(hostile):
  for w in ("nan", "inf", "-inf", "1e39"):
    with pytest.raises(ValueError) as e:
      settings.frozen(
        RewardConfig, {"domain": "hostile:works,hostile:hangs", "weights": (1.0, float(w))}
      )
    assert str(e.value) == (
      f"reward.weights: expected finite numbers (a float32 holds them), got {float(w)!r}"
    )
  with pytest.raises(ValueError, match=r"^reward.domain: 'hostile:works' is named twice"):
    RewardConfig(domain="hostile:works,hostile:works")
  fns = custom.score_functions("hostile:works,user_twin:works", ("math",))
  assert list(custom.metric_names(fns).values()) == ["hostile_works", "user_twin_works"]
  assert custom.metric_key("a\nb\x1b[31m") == "a_b_31m" and custom.metric_key("") == "key"


def test_a_reward_that_is_not_finite_never_reaches_the_advantages():
  def scorer(texts, golds, prompts=None):
    r = np.array([1.0, np.nan, np.inf, -np.inf, 1e39, 0.5])
    return r, r > 0

  class Scoring:
    name = "scoring"

    def buffer(self, ctx, step):
      self.out = ctx.score(["x"] * 6, ["1"] * 6)
      return [], {}

    out = None

  method = Scoring()
  m = rollout.Buffers(method, step_context(None, scorer), overlap=False).take(0).metrics
  rewards, correct = method.out
  assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 0, 0, 0, 0, 0.5]
  assert correct.tolist() == [True, False, False, False, False, True]
  assert m["verdict_reward_not_finite"] == 4


RUN_MODULE = """
import os, time

import torch


def works(responses, answers, prompts):
  return [float(len(r) % 3 == 1) for r in responses]


def hangs(responses, answers, prompts):
  time.sleep(3600)


def exits(responses, answers, prompts):
  os._exit(0)


def tensor(responses, answers, prompts):
  return torch.zeros(len(responses), requires_grad=True) * 1.0
"""


def test_launch_train_goes_on_past_bad_functions_with_the_good_ones_rewards(tmp_path):
  """A list of a working function with one that hangs, one that exits and one that returns
  a tensor with a graph: the run finishes, names each bad one once, counts its verdicts,
  and trains on exactly the rewards of a run with the working function alone."""
  (tmp_path / "user_reward.py").write_text(textwrap.dedent(RUN_MODULE))
  environ = tiny_run.env(tmp_path)
  flags = [*tiny_run.RAW_PROMPTS_RUN, "--config.rl.steps=2", "--config.reward.fn_timeout_s=1"]
  flags.append("--config.reward.preflight=False")  # a toy reward: it pays for length
  bad = "user_reward:works,user_reward:hangs,user_reward:exits,user_reward:tensor"
  out, rows = tiny_run.train(
    tmp_path / "bad", *flags, f"--config.reward.domain={bad}", environ=environ, timeout=600
  )
  _, alone = tiny_run.train(
    tmp_path / "alone", *flags, "--config.reward.domain=user_reward:works", environ=environ
  )
  for name in ("hangs", "exits"):
    said = re.findall(rf"reward.domain user_reward:{name} failed on \d+ of \d+ responses", out)
    assert len(said) == 1, out[-3000:]
  assert "user_reward:tensor failed" not in out and "user_reward:works failed" not in out
  assert len(rows) == len(alone) == 2
  for row, one in zip(rows, alone):
    assert row["verdict_fn_timeout_hangs"] == row["verdict_fn_died_exits"] == 8
    assert row["verdict_fn_not_finite_tensor"] == 0 and row["reward_fn_tensor"] == 0
    assert row["reward_fn_works"] == one["reward_mean"] == row["reward_mean"]
    assert row["loss"] == one["loss"]
