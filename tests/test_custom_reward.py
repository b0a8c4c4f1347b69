"""A reward of the user's own (`reward.domain = "package.module:attribute"`) and the prompt
template a run renders with (`data.chat_template`).

The user's modules are real files imported from a temporary directory; the score function
scores with the real math-verify; templates render with a real trained tokenizer. The last
test runs launch.train end to end with both."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tiny_run import RAW_PROMPTS_RUN

from rlvr import rollout
from rlvr.common import settings
from rlvr.data import chat_templates, datasets, prompts
from rlvr.rewards import RewardConfig
from rlvr.rewards.verifiers import FunctionVerifier, open_verifier

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_REWARDS = '''
import math

import numpy as np
from math_verify import parse, verify

SEEN = []  # every call's (responses, answers, prompts)
ENTERED = []


def by_math_verify(responses, answers, prompts):
  SEEN.append((responses, answers, prompts))
  return [
    1.0 if verify(parse("$" + a + "$"), parse(r)) else -0.5 for r, a in zip(responses, answers)
  ]


def raises(responses, answers, prompts):
  raise RuntimeError("the grader is down")


def some_not_numbers(responses, answers, prompts):
  return [1.0, float("nan"), math.inf, "1.0", None, True, 10**400, 0.25]


def one_short(responses, answers, prompts):
  return [1.0] * (len(responses) - 1)


def a_dict(responses, answers, prompts):
  return {"reward": 1.0}


def as_numpy(responses, answers, prompts):
  return np.arange(len(responses), dtype=np.float64) - 1


def two_arguments(responses, answers):
  return [0.0] * len(responses)


NOT_CALLABLE = 3


class Lengths:
  """A whole Verifier from a factory (a class taking the RewardConfig), a context manager."""

  def __init__(self, cfg):
    self.cfg = cfg

  def __enter__(self):
    ENTERED.append("enter")
    return self

  def __exit__(self, *exc):
    ENTERED.append("exit")

  def score(self, texts, golds, prompts=None):
    r = np.array([float(len(t) == len(g)) for t, g in zip(texts, golds)], np.float32)
    return r, r > 0

  def judge(self, texts, golds, prompts=None):
    r, c = self.score(texts, golds)
    return r, c, [{}] * len(texts)

  def well_formed(self, text):
    return bool(text)

  def for_eval(self):
    return self

  def check_answers(self, examples, name):
    pass


def half_a_verifier(cfg):
  return Lengths.score
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
  """The module `user_rewards` above, importable while this module's tests run."""
  root = tmp_path_factory.mktemp("user_code")
  (root / "user_rewards.py").write_text(USER_REWARDS)
  (root / "broken_rewards.py").write_text("import math\n\ndef score(responses, answers, prompts:\n")
  sys.path.insert(0, str(root))
  import user_rewards

  yield user_rewards
  sys.path.remove(str(root))
  sys.modules.pop("user_rewards", None)


def _verifier(name: str) -> FunctionVerifier:
  cfg = RewardConfig(domain=f"user_rewards:{name}")
  with open_verifier(cfg) as v:
    return v


TEXTS = [r"so \boxed{13}", r"\boxed{12}", "13", r"\boxed{\frac{1}{2}}"] * 2
GOLDS = ["13", "13", "13", "0.5"] * 2
PROBLEMS = ["Compute 3*2+7.", "Compute 3*2+7.", "Compute 3*2+7.", "Half of one?"] * 2


def test_the_function_gets_responses_answers_and_prompts_and_its_rewards_count(user):
  v = _verifier("by_math_verify")
  assert isinstance(v, FunctionVerifier)
  user.SEEN.clear()
  rewards, correct = scored = v.score(TEXTS, GOLDS, prompts=PROBLEMS)
  assert user.SEEN == [(TEXTS, GOLDS, PROBLEMS)]
  assert rewards.dtype == np.float32
  assert rewards.tolist() == [1.0, -0.5, 1.0, 1.0] * 2  # math-verify: 13 = 13, 1/2 = 0.5
  assert correct.tolist() == [True, False, True, True] * 2  # correct: reward > 0
  assert scored.counts == {"scored": 8, "fn_raised": 0, "fn_wrong_length": 0, "fn_not_finite": 0}
  r, c, notes = v.judge(TEXTS[:2], GOLDS[:2])  # no prompts given: the function sees ""
  assert user.SEEN[-1] == (TEXTS[:2], GOLDS[:2], ["", ""])
  assert notes == [{"verdict": "scored"}] * 2 and r.tolist() == [1.0, -0.5]
  assert v.for_eval() is v and v.well_formed(r"\boxed{3}") and not v.well_formed("no answer")


def test_a_step_counts_the_verdicts_of_a_function_that_misbehaves(user, caplog):
  texts, golds = TEXTS, GOLDS
  with caplog.at_level(logging.WARNING, logger="rlvr.rewards.custom"):
    v = _verifier("raises")
    rewards, correct = scored = v.score(texts, golds, PROBLEMS)
  assert rewards.tolist() == [0.0] * 8 and not correct.any()
  assert scored.counts["fn_raised"] == 8 and scored.counts["scored"] == 0
  assert "reward.domain user_rewards:raises raised RuntimeError: the grader is down" in caplog.text

  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="rlvr.rewards.custom"):
    rewards, correct, notes = _verifier("some_not_numbers").judge(texts, golds, PROBLEMS)
  # NaN, inf, a string, None and an int too large for a float score 0; True is 1.0
  assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.25]
  assert [n["verdict"] for n in notes] == [
    "scored",
    "fn_not_finite",
    "fn_not_finite",
    "fn_not_finite",
    "fn_not_finite",
    "scored",
    "fn_not_finite",
    "scored",
  ]
  assert "gave 5 of 8 responses no finite number (response 1: nan)" in caplog.text

  for name in ("one_short", "a_dict"):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards.custom"):
      rewards, _ = scored = _verifier(name).score(texts, golds, PROBLEMS)
    assert rewards.tolist() == [0.0] * 8 and scored.counts["fn_wrong_length"] == 8, name
    assert f"user_rewards:{name} returned" in caplog.text and "for 8 responses" in caplog.text

  rewards, correct = _verifier("as_numpy").score(texts, golds, PROBLEMS)
  assert rewards.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6] and correct.sum() == 6

  class Scoring:  # a method whose buffer only scores: the step's metrics of one score call
    name = "scoring"

    def buffer(self, env, step):
      env.score(texts, golds, PROBLEMS)
      env.score(texts[:3], golds[:3], PROBLEMS[:3])
      return [], {}

  env = rollout.StepEnv(
    None,
    _verifier("some_not_numbers").score,
    rl=rollout.RLConfig(),
    pad_id=0,
    encode=list,
    encode_task=list,
  )
  m = rollout.build_buffer(Scoring(), env, step=0, version=0).metrics
  assert m["verdict_fn_not_finite"] == 5 and m["verdict_fn_wrong_length"] == 3
  assert m["verdict_scored"] == 3 and m["verdict_fn_raised"] == 0


def _one_line(name: str) -> str:
  with pytest.raises(ValueError) as e:
    settings.frozen(RewardConfig, {"domain": name}, prefix="reward.")
  text = str(e.value)
  assert "\n" not in text, text
  return text


def test_a_reward_that_cannot_be_used_stops_the_start_in_one_line(user):
  assert _one_line("no_such_module:score") == (
    "reward.domain: cannot load 'no_such_module:score': No module named 'no_such_module'"
  )
  assert _one_line("broken_rewards:score").startswith(
    "reward.domain: cannot load 'broken_rewards:score': importing 'broken_rewards' raised "
    "SyntaxError: "
  )
  assert _one_line("user_rewards:nothing_here").startswith(
    "reward.domain: cannot load 'user_rewards:nothing_here': module 'user_rewards' has no "
  )
  assert _one_line("user_rewards:two_arguments") == (
    "reward.domain: 'user_rewards:two_arguments' takes (responses, answers); expected "
    "score(responses, answers, prompts) -> list[float], or a factory(cfg) returning a "
    "Verifier (rlvr.rewards.custom)"
  )
  assert _one_line("user_rewards:NOT_CALLABLE") == (
    "reward.domain: 'user_rewards:NOT_CALLABLE' is not a function (type int)"
  )
  assert _one_line("maths") == (
    "reward.domain: unknown 'maths'; known: ['code', 'math'], or "
    "'package.module:function' for a reward defined elsewhere"
  )
  with pytest.raises(ValueError, match=r"^reward.domain: 'user_rewards:half_a_verifier' made a "):
    with open_verifier(RewardConfig(domain="user_rewards:half_a_verifier")):
      pass


def test_a_factory_makes_the_whole_verifier_and_is_entered_for_the_run(user):
  user.ENTERED.clear()
  with open_verifier(RewardConfig(domain="user_rewards:Lengths")) as v:
    assert isinstance(v, user.Lengths) and v.cfg.domain == "user_rewards:Lengths"
    assert user.ENTERED == ["enter"]
    assert v.score(["ab", "abc"], ["xy", "xy"])[0].tolist() == [1.0, 0.0]
  assert user.ENTERED == ["enter", "exit"]


# ------------------------------------------------------------------ chat templates
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from rlvr.model import train_tokenizer

  return train_tokenizer(str(tmp_path_factory.mktemp("tok")))


def test_prompts_render_in_the_chosen_template(tokenizer, tmp_path):
  problem = "Compute 12+7*3."
  own = tokenizer.decode(prompts.format_prompt(tokenizer, problem, ""))
  assert own == "<|im_start|>user\nCompute 12+7*3.<|im_end|>\n<|im_start|>assistant\n"
  assert prompts.format_prompt(tokenizer, problem, "", "tokenizer") == prompts.format_prompt(
    tokenizer, problem, ""
  )
  raw = prompts.format_prompt(tokenizer, problem, "Be brief.", "none")
  assert raw == tokenizer("Compute 12+7*3.\n\nBe brief.")["input_ids"]
  assert tokenizer.decode(raw) == "Compute 12+7*3.\n\nBe brief."

  jinja = tmp_path / "plain.jinja"
  jinja.write_text(
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
  )
  mine = tokenizer.decode(prompts.format_prompt(tokenizer, problem, "", str(jinja)))
  assert mine == "USER: Compute 12+7*3.\nASSISTANT:"

  tokenizer.chat_template, kept = None, tokenizer.chat_template  # a base model's tokenizer
  try:
    chatml = tokenizer.decode(prompts.format_prompt(tokenizer, problem, "", "chatml"))
    assert chatml == own
    with pytest.raises(ValueError, match=r"^data.chat_template: the tokenizer has no chat "):
      prompts.format_prompt(tokenizer, problem, "")
  finally:
    tokenizer.chat_template = kept

  broken = tmp_path / "broken.jinja"
  broken.write_text("{% for m in messages %}{{ m['content'] }")
  with pytest.raises(ValueError, match=r"^data.chat_template: '.*broken.jinja' does not render: "):
    prompts.format_prompt(tokenizer, problem, "", str(broken))


def test_a_bad_chat_template_setting_is_one_line_naming_the_field(tmp_path):
  for value, start in (
    ("chatm", "data.chat_template: unknown 'chatm': not '', 'tokenizer', 'none', a built-in"),
    (str(tmp_path / "gone.jinja"), "data.chat_template: unknown '"),
  ):
    with pytest.raises(ValueError) as e:
      settings.frozen(datasets.DataConfig, {"chat_template": value}, prefix="data.")
    assert str(e.value).startswith(start) and "\n" not in str(e.value), str(e.value)
  (tmp_path / "empty.jinja").write_text(" \n")
  with pytest.raises(ValueError, match=r"^data.chat_template: .*empty.jinja is empty$"):
    chat_templates.check(str(tmp_path / "empty.jinja"))
  for value in ("", "tokenizer", "none", "chatml"):
    assert settings.frozen(datasets.DataConfig, {"chat_template": value}).chat_template == value


# ------------------------------------------------------------------ end to end
REWARD_MODULE = """
import json, os

def score(responses, answers, prompts):
  rewards = [float(len(r) % 3) / 2 if len(r) % 5 else float("nan") for r in responses]
  with open(os.environ["REWARD_CALLS"], "a") as f:
    f.write(json.dumps([responses, answers, prompts, rewards]) + "\\n")
  return rewards
"""


def test_launch_train_with_a_user_reward_on_raw_prompts(tmp_path):
  """Training and evaluation score with the user's function, which sees each response's
  problem and answer; prompts are the raw problem text: 8 tokens each, which the tiny
  tokenizer's ChatML turns into 21, so rl.loop.max_prompt_len=8 drops none of them only
  when no template is rendered."""
  (tmp_path / "arith_reward.py").write_text(textwrap.dedent(REWARD_MODULE))
  calls_path = tmp_path / "calls.jsonl"
  workdir = tmp_path / "run"
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    REWARD_CALLS=str(calls_path),
  )
  flags = [*RAW_PROMPTS_RUN, "--config.rl.steps=1", "--config.reward.domain=arith_reward:score"]
  out = subprocess.run(
    [sys.executable, "-m", "launch.train", "--config=configs/tiny_rlvr.py", f"--workdir={workdir}"]
    + flags,
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]

  from configs import tiny_rlvr

  c = tiny_rlvr.get_config()
  c.data.arithmetic.n_sft, c.data.arithmetic.n_train, c.data.arithmetic.n_heldout = 0, 8, 2
  run_data = datasets.prepare(c.data, c.seed)
  answer = {e.problem: e.answer for e in run_data.train + run_data.evals["heldout"]}
  calls = [json.loads(line) for line in calls_path.read_text().splitlines()]
  # eval before RL (2 problems x 2), the step's rollout (2 x 4), eval after RL
  assert [len(responses) for responses, *_ in calls] == [4, 8, 4]
  for _, answers, problems, _ in calls:
    assert problems and all(answer[p] == a for p, a in zip(problems, answers))  # raw problems
    assert len(set(problems[:2])) == 1  # a group's responses share their problem
  heldout = {e.problem for e in run_data.evals["heldout"]}
  assert set(calls[0][2]) == set(calls[2][2]) == heldout

  def used(rewards):  # what the run makes of the user's values: NaN scores 0
    return [0.0 if r != r else r for r in rewards]

  (step,) = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  step_rewards = used(calls[1][3])
  assert step["reward_mean"] == pytest.approx(np.mean(step_rewards))
  assert step["accuracy"] == pytest.approx(np.mean([r > 0 for r in step_rewards]))
  nan = sum(r != r for r in calls[1][3])
  assert step["verdict_fn_not_finite"] == nan and step["verdict_scored"] == 8 - nan
  assert step["prompts_too_long"] == 0
  for i, phase in ((0, "eval_before_rl"), (2, "eval_after_rl")):
    result = json.loads((workdir / phase / "eval.json").read_text())["heldout"]
    assert result["avg@2"][0] == pytest.approx(np.mean([r > 0 for r in used(calls[i][3])]))
