"""Code as a domain of the whole pipeline: training files with tests in a column, the code
verifier, the paper code configs scaled down, SvS on code, HumanEval through launch.evaluate.

Every program runs in the real bubblewrap sandbox; the policy is the test model after SFT on
arithmetic answered by programs (worked steps, then a python block printing the result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tiny_run
from paths import REPO

from rlvr.data import datasets
from rlvr.data import readers as data_lib
from rlvr.rewards import RewardConfig
from rlvr.rewards.code import REASONS
from rlvr.rewards.verifiers import open_verifier

CODE = RewardConfig(domain="code")


def test_the_code_configs_are_the_paper_configs_the_math_test_leaves_out():
  import test_scale_down

  shipped = {f[:-3] for f in os.listdir(os.path.join(REPO, "configs")) if "primerl" in f}
  assert shipped == {"rlvr_primerl_qwen25_7b", "svs_primerl_qwen25_7b"}
  assert not shipped & set(test_scale_down.PAPER)


def _apps_rows(problems):
  """Apps / TACO layout: `question`, tests as a JSON string in `input_output`."""
  return [
    {"question": p.problem, "input_output": p.answer, "difficulty": "introductory"}
    for p in problems
  ]


def _primerl_rows(problems):
  """verl parquet layout (PRIME-RL): chat `prompt`, tests as JSON in reward_model.ground_truth."""
  return [
    {
      "prompt": [{"role": "user", "content": p.problem}],
      "reward_model": {"ground_truth": p.answer, "style": "rule"},
      "data_source": "codecontests",
      "ability": "code",
    }
    for p in problems
  ]


@pytest.fixture(scope="module")
def code_files(tmp_path_factory):
  """An Apps-style jsonl (train) and a PRIME-RL-style parquet (held out) of arithmetic
  problems whose tests are "print the result, given no input"."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  from rlvr.data.tasks import arithmetic

  train, held = arithmetic.make_splits(64, 8, max_operand=9, seed=3)
  train, held = [[arithmetic.as_program(p) for p in ps] for ps in (train, held)]
  root = tmp_path_factory.mktemp("code_data")
  paths = {"train": str(root / "train.jsonl"), "heldout": str(root / "heldout.parquet")}
  with open(paths["train"], "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in _apps_rows(train))
  pq.write_table(pa.Table.from_pylist(_primerl_rows(held)), paths["heldout"])
  return paths


def test_both_layouts_read_into_problems_whose_tests_run(code_files):
  with open_verifier(CODE) as v:
    for path in code_files.values():
      exs = list(data_lib.read_dataset(path))
      v.check_answers(exs, path)
      answer = json.loads(exs[0].answer)["outputs"][0]
      right = f"work.\n```python\nprint({answer})\n```"
      wrong = f"```python\nprint({int(answer) + 1})\n```"
      rewards, correct, notes = v.judge([right, wrong, "no code"], [exs[0].answer] * 3)
      assert rewards.tolist() == [1.0, 0.0, 0.0] and correct.tolist() == [True, False, False]
      assert [n["verdict"] for n in notes] == ["ok", "wrong_answer", "no_code"]
      assert v.well_formed(right) and not v.well_formed("no code")


def test_a_row_without_usable_tests_is_named_by_its_index(tmp_path):
  path = tmp_path / "bad.jsonl"
  rows = [
    {"question": "ok", "input_output": {"inputs": ["1\n"], "outputs": ["1"]}},
    {"question": "bad", "input_output": '{"inputs": ["1"]}'},  # no outputs
    {"question": "bad too", "input_output": "not json"},
  ]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  exs = list(data_lib.read_dataset(str(path)))
  assert json.loads(exs[0].answer) == rows[0]["input_output"]  # an object is kept as JSON
  with open_verifier(CODE) as v, pytest.raises(ValueError) as e:
    v.check_answers(exs, "data.train_path")
  message = str(e.value)
  assert "2 of 3" in message and "row 1:" not in message
  assert f"tests): {path}: line 2 (row index 1): tests: expected lists under" in message
  assert message.endswith(
    f"; {path}: line 3 (row index 2): tests: not valid JSON (Expecting value at character 1)"
  ), message


def test_no_sandbox_stops_the_run_before_anything_runs(tmp_path, monkeypatch):
  from rlvr.sandbox import CodeSandboxError, bwrap

  monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap
  monkeypatch.setattr(bwrap, "_checked", {})  # the probe forgotten for this test
  with pytest.raises(CodeSandboxError, match="bubblewrap"):
    with open_verifier(CODE):
      pass


@pytest.fixture(scope="module")
def code_policy(tiny_dirs, tmp_path_factory):
  """The test qwen2 model after SFT on 300 arithmetic problems answered by programs, plus
  their inverse pairs (the synthesis task SvS asks for)."""
  import sft_policy

  return sft_policy.train(tiny_dirs["qwen2"], str(tmp_path_factory.mktemp("code_sft")), "code")


def _samples(path):
  with open(path) as f:
    return [x for line in f for x in json.loads(line)["responses"]]


def test_svs_on_code_paper_config_scaled_down_runs_two_steps(code_policy, code_files, tmp_path):
  from configs import cpu
  from rlvr.report import metrics
  from rlvr.run import experiment, runner

  experiment.check(cpu.get_config("rlvr_primerl_qwen25_7b"))  # its RLVR baseline resolves
  c = cpu.get_config("svs_primerl_qwen25_7b")
  assert c.reward.domain == "code" and c.reward.code.sandbox == "bwrap"
  c.workdir = str(tmp_path / "svs_primerl")
  c.model.path = code_policy
  c.data.train_path = code_files["train"]
  c.data.eval_paths = [code_files["heldout"]]
  c.data.instruction = ""  # the SFT'd policy's prompt format
  c.svs.template = "arithmetic"  # the synthesis task it was taught
  c.rl.loop.max_response_len = c.eval.sampling.max_tokens = 40  # steps, then the program
  c.rl.loop.max_extra_rounds = 1
  c.eval.samples = True
  summary = runner.run(c)
  rows = metrics.read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1] and summary["method"] == "svs"
  assert sum(1 - r.get("skipped_update", 0) for r in rows) >= 1
  assert max(r["accuracy"] for r in rows) > 0  # programs passed their tests in the sandbox
  assert sum(r.get("svs_syntheses", 0) for r in rows) > 0
  responses = _samples(os.path.join(c.workdir, "eval_after_rl", "samples_heldout.jsonl"))
  assert {x["verdict"] for x in responses} <= set(REASONS)
  assert all(x["correct"] == (x["verdict"] == "ok") for x in responses)


def test_tiny_code_runs_then_evaluates_on_humaneval(code_policy, tmp_path):
  from configs import tiny_code
  from rlvr.report import metrics
  from rlvr.run import runner

  c = tiny_code.get_config()
  c.workdir = str(tmp_path / "tiny_code")
  c.model.path, c.sft.steps = code_policy, 0  # already SFT'd on the same task
  c.rl.steps = c.checkpoint.every = 2
  c.data.arithmetic.n_train, c.data.arithmetic.n_heldout = 64, 8
  c.rl.loop.prompts_per_step = c.rl.learner.ppo_mini_batch_size = 4
  c.rl.loop.max_extra_rounds = 1
  c.eval.sampling.n = 2
  runner.run(c)
  rows = metrics.read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1] and max(r["accuracy"] for r in rows) > 0
  # The finished run evaluated again, with HumanEval added: every response gets a verdict.
  again = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch.evaluate",
      f"--run={c.workdir}",
      "--data=humaneval",
      "--limit=2",
      "--n=1",
      "--max_tokens=16",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert again.returncode == 0, again.stderr[-3000:]
  report = json.loads(open(os.path.join(c.workdir, "eval_again", "eval.json")).read())
  assert report["humaneval"]["problems"] == 2 and report["heldout"]["problems"] == 2
  for name in ("heldout", "humaneval"):
    responses = _samples(os.path.join(c.workdir, "eval_again", f"samples_{name}.jsonl"))
    assert len(responses) == 2 and {x["verdict"] for x in responses} <= set(REASONS)
    assert all(x["correct"] == (x["verdict"] == "ok") for x in responses)


def test_humaneval_is_an_eval_path_of_the_code_configs():
  from configs import svs_primerl_qwen25_7b

  c = svs_primerl_qwen25_7b.get_config()
  assert list(c.data.eval_paths) == ["humaneval"]
  d = c.data.to_dict()
  d.update(train_path=os.path.join(REPO, "tests", "fixtures", "dapo_math_17k_first500.parquet"))
  evals = datasets.prepare(d, 0).evals
  assert len(evals["humaneval"]) == 164
  assert svs_primerl_qwen25_7b.get_config().svs.template == "code"


def test_a_code_run_without_bubblewrap_stops_in_one_line(tmp_path):
  """No bwrap on PATH: launch.train stops before building anything, in one line naming the
  package to install; the run never falls back to unsandboxed code."""
  venv_bin = os.path.dirname(sys.executable)
  assert not os.path.exists(os.path.join(venv_bin, "bwrap"))
  proc = tiny_run.launch(
    tmp_path / "run",
    config="configs/tiny_code.py",
    environ=tiny_run.env(PATH=venv_bin),
    timeout=300,
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert lines[-1].startswith("launch.train: bubblewrap (bwrap) is not installed: apt-get"), lines
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(tmp_path / "run" / "checkpoints")
