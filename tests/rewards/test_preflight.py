"""The reward proven before step 1 (`rlvr.rewards.preflight`): gold answers that do not score
and rewards that pay without the answer stop the run in one line, before any model is
built; a sound reward passes. The verifiers are the real ones (math-verify in its pool, the
user's functions in the reward workers); the last tests go through launch.train."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import tiny_run
from paths import REPO

from rlvr.data import readers
from rlvr.rewards import RewardConfig, preflight
from rlvr.rewards.verifiers import open_verifier

USER = """
from math_verify import parse, verify


def pays_for_nothing(responses, answers, prompts):
  return [1.0 if not r.strip() else float(a in r) for r, a in zip(responses, answers)]


def boxed_anything(completions, **kwargs):  # TRL's form: a format reward alone
  return [1.0 if "\\\\boxed{" in c else 0.0 for c in completions]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  return float(verify(parse("$" + ground_truth + "$"), parse(solution_str)))


def format_credit(completions, **kwargs):
  return [0.5 if "\\\\boxed{" in c else 0.0 for c in completions]
"""


@pytest.fixture(scope="module")
def user(tmp_path_factory):
  root = tmp_path_factory.mktemp("preflight_code")
  (root / "preflight_rewards.py").write_text(USER)
  sys.path.insert(0, str(root))
  yield root
  sys.path.remove(str(root))
  sys.modules.pop("preflight_rewards", None)


def _rows(answers):
  return [
    readers.Example(f"Compute {a} - 0.", str(a), index=i, path="train.jsonl")
    for i, a in enumerate(answers)
  ]


def _check(domain: str, answers=(3, 14, 15, 92, 65, 35), **fields):
  cfg = RewardConfig(domain=domain, **fields)
  with open_verifier(cfg) as v:
    return preflight.check(v, cfg, _rows(answers))


def test_a_sound_reward_passes_and_says_what_it_measured(user):
  report = _check("math", integer_answers=True)
  assert report.rows == report.gold_scored == 6 and report.bad_gold == []
  assert report.probes["the empty response"] == {"mean_reward": 0.0, "as_much_as_gold": 0}
  assert report.line().startswith("reward preflight: 6 of 6 gold answers score (mean 1)")
  # accuracy plus a format credit: a boxed wrong number earns the credit, never the gold's
  report = _check(
    "preflight_rewards:compute_score,preflight_rewards:format_credit", weights=(1.0, 0.5)
  )
  assert report.gold_mean == 1.25
  assert report.probes["a wrong final answer"] == {"mean_reward": 0.25, "as_much_as_gold": 0}


def test_gold_answers_that_do_not_score_are_named_with_the_reason(user):
  with pytest.raises(preflight.PreflightError) as e:
    _check("math", answers=("3/4", "1.5", 7, "x+1"), integer_answers=True)
  line = str(e.value)
  assert "\n" not in line and line.startswith(
    "reward.preflight: 3 of 4 gold answers of data.train_path do not score when written as "
    "the instruction asks ('The answer is \\\\boxed{3/4}.'): train.jsonl: "
  ), line
  assert "('3/4'): not an integer (reward.integer_answers=True)" in line
  # one bad row of 20 is within reward.preflight_max_bad_gold (10%): reported, not fatal
  report = _check("math", answers=[*range(19), "3/4"], integer_answers=True)
  assert report.gold_scored == 19 and len(report.bad_gold) == 1


@pytest.mark.parametrize(
  "domain, probe",
  [
    ("preflight_rewards:pays_for_nothing", "the empty response ('')"),
    ("preflight_rewards:boxed_anything", "an empty final answer ('\\\\boxed{}')"),
  ],
)
def test_a_reward_that_pays_without_the_answer_stops_naming_the_probe(user, domain, probe):
  with pytest.raises(preflight.PreflightError) as e:
    _check(domain)
  assert str(e.value).startswith(
    f"reward.preflight: {probe} earns as much as the gold answer on 6 of 6 rows (mean reward "
    "1): reward.domain " + domain + " pays without the answer"
  ), str(e.value)


def _eval(pass1, well_formed, truncated):
  return {"pass@1": pass1, "pass@4": pass1, "well_formed": well_formed, "truncated": truncated}


def test_before_rl_names_why_every_response_scores_alike():
  assert preflight.before_rl({"heldout": _eval(0.25, 0.9, 0.0)}, 64) is None
  line = preflight.before_rl({"heldout": _eval(0.0, 0.25, 0.5)}, 64)
  assert line == (
    "reward preflight: before RL every held-out response scores 0 (heldout 0.0%): 75% state "
    "no final answer in the form the reward reads, 25% state one that is wrong, 50% were cut "
    "at eval.sampling.max_tokens=64; try a warm start that teaches the answer format "
    "(sft.steps on worked solutions), or data.instruction / reward.extraction that match what "
    "the model writes; a longer rl.loop.max_response_len (and eval.sampling.max_tokens); "
    "easier problems, more samples per prompt (rl.loop.group_size) or a higher temperature "
    "(rl.loop.temperature) so that some groups hold a right answer"
  )
  line = preflight.before_rl({"a": _eval(1.0, 1.0, 0.0), "b": _eval(1.0, 1.0, 0.0)}, 64)
  assert line.startswith("reward preflight: before RL every held-out response is right (a ")


# ------------------------------------------------------------------ through launch.train
FLAGS = [
  *(f for f in tiny_run.RAW_PROMPTS_RUN if not f.startswith("--config.data.arithmetic.")),
  *(f"--config.data.arithmetic.{n}=0" for n in ("n_sft", "n_train", "n_heldout")),
  "--config.data.kind=files",
  "--config.rl.steps=1",
]


def _files(tmp_path, answers) -> list[str]:
  train = tmp_path / "train.jsonl"
  train.write_text(
    "".join(json.dumps({"problem": f"Compute {a} - 0.", "answer": a}) + "\n" for a in answers)
  )
  held = tmp_path / "heldout.jsonl"
  held.write_text(json.dumps({"problem": "Compute 2 - 0.", "answer": "2"}) + "\n")
  return [f"--config.data.train_path={train}", f"--config.data.eval_paths={held}"]


@pytest.mark.parametrize(
  "case, flags, starts",
  [
    (
      "gold",
      ["--config.reward.domain=math"],
      "launch.train: reward.preflight: 4 of 4 gold answers of data.train_path do not score",
    ),
    (
      "empty",
      ["--config.reward.domain=preflight_rewards:pays_for_nothing"],
      "launch.train: reward.preflight: the empty response ('') earns as much as the gold",
    ),
    (
      "boxed",
      ["--config.reward.domain=preflight_rewards:boxed_anything"],
      "launch.train: reward.preflight: an empty final answer ('\\\\boxed{}') earns as much",
    ),
  ],
)
def test_launch_train_stops_before_step_1_in_one_line(user, tmp_path, case, flags, starts):
  (tmp_path / "preflight_rewards.py").write_text(textwrap.dedent(USER))
  answers = ["x+", "3/4", "1.5", "2,5"] if case == "gold" else ["3", "14", "15", "92"]
  out = tiny_run.launch(
    tmp_path / "run",
    *FLAGS,
    *_files(tmp_path, answers),
    *flags,
    environ=tiny_run.env(tmp_path),
    timeout=300,
  )
  assert out.returncode == 1, out.stderr[-3000:]
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith(starts), line
  assert "Traceback" not in out.stderr
  assert not (tmp_path / "run" / "eval_before_rl").exists()  # nothing was sampled


def test_launch_evaluate_runs_the_preflight_alone(tmp_path):
  good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
  good.write_text("".join(json.dumps({"problem": f"{a}?", "answer": a}) + "\n" for a in "123"))
  bad.write_text(json.dumps({"problem": "x?", "answer": "x+"}) + "\n")
  argv = tiny_run.argv(
    tmp_path, "--preflight", "--integer_answers", config=None, module="launch.evaluate"
  )
  argv = [a for a in argv if not a.startswith("--workdir")]
  run = lambda path: subprocess.run(
    [*argv, f"--data={path}"], cwd=REPO, env=tiny_run.env(), capture_output=True, text=True
  )
  out = run(good)
  assert out.returncode == 0 and out.stdout.startswith(
    "good.jsonl: reward preflight: 3 of 3 gold answers score (mean 1)"
  ), out.stderr[-2000:]
  out = run(bad)
  assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith(
    "launch.evaluate: reward.preflight: 1 of 1 gold answers of bad.jsonl do not score"
  ), out.stderr[-2000:]
