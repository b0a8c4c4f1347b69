"""A reward of the user's own (`reward.domain = "package.module:attribute"`) and the prompt
template a run renders with (`data.chat_template`).

The user's modules are real files imported from a temporary directory; the score function
scores with the real math-verify; templates render with a real trained tokenizer. The last
test runs launch.train end to end with both."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tiny_run
from paths import REPO
from step_context import step_context

from rlvr import rollout
from rlvr.common import settings
from rlvr.data import chat_templates, datasets, prompts
from rlvr.rewards import RewardConfig, custom_caller
from rlvr.rewards.verifiers import FunctionVerifier, open_verifier

USER_REWARDS = '''
import json
import math
import os

import numpy as np
from math_verify import parse, verify

# what the functions saw, one JSON line a call: they run in the reward workers
SEEN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.jsonl")
ENTERED = []


def _seen(*what):
  with open(SEEN_FILE, "a") as f:
    f.write(json.dumps(what) + "\\n")


def seen():
  if not os.path.exists(SEEN_FILE):
    return []
  with open(SEEN_FILE) as f:
    return [json.loads(line) for line in f]


def forget():
  if os.path.exists(SEEN_FILE):
    os.remove(SEEN_FILE)


def by_math_verify(responses, answers, prompts):
  _seen(responses, answers, prompts)
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


def raises_on_fractions(responses, answers, prompts):
  if any("frac" in r for r in responses):
    raise ValueError("cannot read a fraction")
  return [1.0] * len(responses)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  """verl's form: one response at a time; a dict result's other keys are logged."""
  _seen("verl", data_source, solution_str, ground_truth, extra_info)
  if "frac" in solution_str:
    raise ValueError("cannot read a fraction")
  return {"score": float(ground_truth in solution_str), "chars": len(solution_str)}


def compute_score_given_lists(data_source, solution_str, ground_truth, extra_info=None):
  return [float(a in s) for s, a in zip(solution_str, ground_truth)]  # written for lists


def accuracy_reward(completions, solution, **kwargs):
  """TRL's form, conversational: None where it does not apply."""
  _seen("trl", completions, solution, sorted(kwargs))
  texts = [c[0]["content"] for c in completions]
  return [None if "frac" in t else float(s in t) for t, s in zip(texts, solution)]


def columns_reward(completions, **kwargs):
  _seen(kwargs)
  return [0.0] * len(completions)


def format_reward(completions, **kwargs):
  return [0.5 if "boxed" in c[0]["content"] else 0.0 for c in completions]


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


def _verifier(name: str, **fields):
  """The verifier of user_rewards' function `name`, open for a `with` block."""
  return open_verifier(RewardConfig(domain=f"user_rewards:{name}", **fields))


TEXTS = [r"so \boxed{13}", r"\boxed{12}", "13", r"\boxed{\frac{1}{2}}"] * 2
GOLDS = ["13", "13", "13", "0.5"] * 2
PROBLEMS = ["Compute 3*2+7.", "Compute 3*2+7.", "Compute 3*2+7.", "Half of one?"] * 2


def test_the_function_gets_responses_answers_and_prompts_and_its_rewards_count(user):
  with _verifier("by_math_verify") as v:
    assert isinstance(v, FunctionVerifier)
    user.forget()
    rewards, correct = scored = v.score(TEXTS, GOLDS, prompts=PROBLEMS)
    assert user.seen() == [[TEXTS, GOLDS, PROBLEMS]]
    assert rewards.dtype == np.float32
    assert rewards.tolist() == [1.0, -0.5, 1.0, 1.0] * 2  # math-verify: 13 = 13, 1/2 = 0.5
    assert correct.tolist() == [True, False, True, True] * 2  # correct: reward > 0
    assert scored.counts == {v: 8 if v == "scored" else 0 for v in custom_caller.VERDICTS}
    r, c, notes = v.judge(TEXTS[:2], GOLDS[:2])  # no prompts given: the function sees ""
    assert user.seen()[-1] == [TEXTS[:2], GOLDS[:2], ["", ""]]
    assert notes == [{"verdict": "scored"}] * 2 and r.tolist() == [1.0, -0.5]
    assert v.for_eval() is v and v.well_formed(r"\boxed{3}") and not v.well_formed("no answer")


def test_a_step_counts_the_verdicts_of_a_function_that_misbehaves(user, caplog):
  texts, golds = TEXTS, GOLDS
  with caplog.at_level(logging.WARNING, logger="rlvr.rewards.custom_caller"):
    with _verifier("raises_on_fractions") as v:
      rewards, correct, notes = v.judge(texts, golds, PROBLEMS)
  # the batch raised: scored one response at a time, only the fractions fail
  assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0] * 2 and correct.sum() == 6
  assert [n["verdict"] for n in notes] == ["scored"] * 3 + ["fn_raised"] + ["scored"] * 3 + [
    "fn_raised"
  ]
  assert (
    "reward.domain user_rewards:raises_on_fractions failed on 2 of 8 responses (raised "
    "ValueError: cannot read a fraction)" in caplog.text
  )

  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="rlvr.rewards.custom_caller"):
    with _verifier("some_not_numbers") as v:
      rewards, correct, notes = v.judge(texts, golds, PROBLEMS)
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
  assert "failed on 5 of 8 responses (gave no finite number (response 1: nan))" in caplog.text

  with _verifier("as_numpy") as v:
    rewards, correct = v.score(texts, golds, PROBLEMS)
  assert rewards.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6] and correct.sum() == 6

  class Scoring:  # a method whose buffer only scores: the step's metrics of one score call
    name = "scoring"

    def buffer(self, ctx, step):
      ctx.score(texts, golds, PROBLEMS)
      ctx.score(texts[:3], golds[:3], PROBLEMS[:3])
      return [], {}

  with _verifier("some_not_numbers") as v:
    ctx = step_context(None, v.score)
    m = rollout.Buffers(Scoring(), ctx, overlap=False).take(0).metrics
  assert m["verdict_fn_not_finite"] == 5 and m["verdict_fn_wrong_length"] == 3
  assert m["verdict_scored"] == 3 and m["verdict_fn_raised"] == 0


def test_a_function_that_fails_on_every_response_stops_the_run_naming_it(user):
  for name, why in (
    ("raises", "raised RuntimeError: the grader is down"),
    ("one_short", "returned 7 values for 8 responses"),
    ("a_dict", "returned a dict for 8 responses"),
    ("compute_score_given_lists", "gave no finite number (response 0: [0.0, 0.0])"),
  ):
    with pytest.raises(custom_caller.RewardFunctionError) as e, _verifier(name) as v:
      v.score(TEXTS, GOLDS, PROBLEMS)
    form = "verl" if name.startswith("compute_score") else "rlvr"
    assert str(e.value).startswith(
      f"reward.domain: user_rewards:{name} failed on all 8 responses of a scoring call: "
      f"{why}; every reward would be 0, so the run stops. rlvr calls this {form}-form "
      "function as "
    ), str(e.value)
  # fewer than custom_caller.STOP_AT responses: verdicts, the run goes on
  with _verifier("raises") as v:
    rewards, _ = scored = v.score(TEXTS[:3], GOLDS[:3], PROBLEMS[:3])
  assert rewards.tolist() == [0.0] * 3 and scored.counts["fn_raised"] == 3


def test_verl_compute_score_is_called_per_response_with_its_extra_info(user):
  with open_verifier(RewardConfig(domain="user_rewards:compute_score", data_source="arith")) as v:
    user.forget()
    rewards, correct = scored = v.score(TEXTS, GOLDS, PROBLEMS)
  calls = sorted(user.seen(), key=lambda x: x[4]["index"])  # two workers: in any order
  assert [x[2] for x in calls] == TEXTS and [x[3] for x in calls] == GOLDS
  assert {x[1] for x in calls} == {"arith"}
  assert [x[4] for x in calls] == [{"prompt": p, "index": i} for i, p in enumerate(PROBLEMS)]
  assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0] * 2 and correct.sum() == 4
  assert scored.counts["fn_raised"] == 2 and scored.counts["scored"] == 6
  chars = [len(t) for t in TEXTS if "frac" not in t]
  assert scored.values == {"reward_info_chars": chars}


def test_trl_reward_functions_with_weights_take_the_dataset_columns(user):
  cfg = RewardConfig(
    domain="user_rewards:accuracy_reward, user_rewards:format_reward",
    weights=(1.0, 2.0),
    conversational=True,
  )
  with open_verifier(cfg) as v:
    user.forget()
    rewards, _, notes = v.judge(TEXTS, GOLDS, PROBLEMS)
    scored = v.score(TEXTS, GOLDS, PROBLEMS)
  [(form, completions, solution, kwargs)] = user.seen()[:1]
  assert form == "trl" and solution == GOLDS
  assert completions[0] == [{"role": "assistant", "content": TEXTS[0]}]
  assert kwargs == ["answer", "ground_truth", "prompts"]
  accuracy, fmt = [1.0, 0.0, 1.0, 0.0] * 2, [0.5, 0.5, 0.0, 0.5] * 2
  assert rewards.tolist() == [a + 2 * f for a, f in zip(accuracy, fmt)]
  assert [n["verdict"] for n in notes] == (["scored"] * 3 + ["fn_none"]) * 2
  assert scored.values == {"reward_fn_accuracy_reward": accuracy, "reward_fn_format_reward": fmt}
  for weights, start in (
    ((1.0,), "reward.weights: 1 weights for 2 reward functions"),
    ((1.0, 2.0), "reward.weights: weigh the functions of a custom reward.domain, not 'math'"),
  ):
    domain = cfg.domain if len(weights) == 1 else "math"
    with pytest.raises(ValueError, match="^" + re.escape(start)):
      settings.frozen(RewardConfig, {"domain": domain, "weights": weights}, prefix="reward.")


def test_the_data_rows_columns_reach_verl_and_trl_functions(user, tmp_path):
  """A data file's other columns, as the run's sets bring them (`check_answers`): verl
  gets the row's data_source and extra_info, TRL each column as a keyword list (None for
  a problem of no row: a synthetic one)."""
  from rlvr.data import readers

  rows = [
    {"question": "Compute 3*2+7.", "answer": 13, "data_source": "file-a", "level": 2},
    {"question": "Half of one?", "answer": "0.5", "extra_info": {"split": "train", "id": 7}},
  ]
  path = tmp_path / "train.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  examples = readers.read_dataset(str(path)).examples
  problems = PROBLEMS[:4] + ["A synthetic problem?"] * 4
  with open_verifier(RewardConfig(domain="user_rewards:compute_score", data_source="d")) as v:
    v.check_answers(examples, "data.train_path")
    user.forget()
    v.score(TEXTS, GOLDS, problems)
  calls = sorted(user.seen(), key=lambda x: x[4]["index"])
  assert [x[1] for x in calls] == ["file-a"] * 3 + ["d"] * 5  # the row's, else the setting
  assert calls[3][4] == {"split": "train", "id": 7, "prompt": "Half of one?", "index": 3}
  assert calls[4][4] == {"prompt": "A synthetic problem?", "index": 4}

  cfg = RewardConfig(domain="user_rewards:columns_reward")
  with open_verifier(cfg) as v:
    v.check_answers(examples, "data.train_path")
    user.forget()
    v.score(TEXTS, GOLDS, problems)
  [[kwargs]] = user.seen()
  assert kwargs["level"] == [2, 2, 2, None, None, None, None, None]
  assert kwargs["answer"] == [13, 13, 13, "0.5", *GOLDS[4:]]  # the row's own, else the gold
  assert kwargs["ground_truth"] == GOLDS and kwargs["prompts"] == problems
  assert "question" not in kwargs  # the problem column is `prompts`


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
    "score(responses, answers, prompts) -> list[float], verl's compute_score(data_source, "
    "solution_str, ground_truth, extra_info=None), TRL's reward_func(completions, **kwargs), "
    "or a factory(cfg) returning a Verifier (rlvr.rewards.custom)"
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

def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # verl's form
  with open(os.environ["REWARD_CALLS"] + ".verl", "a") as f:
    f.write(json.dumps([data_source, solution_str, ground_truth, extra_info]) + "\\n")
  return {"score": float(len(solution_str) % 2), "chars": len(solution_str)}

def reward_func(completions, ground_truth, **kwargs):  # TRL's form
  return [0.25 * (len(c) % 4 == 1) for c in completions]

def lists_expected(data_source, solution_str, ground_truth, extra_info=None):
  return [float(s.strip() == g) for s, g in zip(solution_str, ground_truth)]
"""


def test_launch_train_with_a_user_reward_on_raw_prompts(tmp_path):
  """Training and evaluation score with the user's functions in rlvr's, verl's and TRL's
  forms, summed; the rlvr one sees each response's problem and answer; prompts are the raw
  problem text: 8 tokens each, which the tiny tokenizer's ChatML turns into 21, so
  rl.loop.max_prompt_len=8 drops none of them only when no template is rendered."""
  (tmp_path / "arith_reward.py").write_text(textwrap.dedent(REWARD_MODULE))
  calls_path = tmp_path / "calls.jsonl"
  workdir = tmp_path / "run"
  environ = tiny_run.env(tmp_path, REWARD_CALLS=str(calls_path))
  domain = "arith_reward:score,arith_reward:compute_score,arith_reward:reward_func"
  flags = [*tiny_run.RAW_PROMPTS_RUN, "--config.rl.steps=1", f"--config.reward.domain={domain}"]
  flags.append("--config.reward.data_source=arith")
  flags.append("--config.reward.preflight=False")  # toy rewards: they pay for length
  _, steps = tiny_run.train(workdir, *flags, environ=environ, timeout=300)

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

  verl = [json.loads(line) for line in (tmp_path / "calls.jsonl.verl").read_text().splitlines()]
  # one response a call, each with its answer and problem (two workers: in any order)
  assert sorted((v[1], v[2], v[3]["prompt"]) for v in verl) == sorted(
    t for call in calls for t in zip(*call[:3])
  )
  assert {v[0] for v in verl} == {"arith"}

  def used(call):  # what the run makes of the three functions' values: NaN scores 0
    return [
      (0.0 if r != r else r) + len(t) % 2 + 0.25 * (len(t) % 4 == 1)
      for t, r in zip(call[0], call[3])
    ]

  (step,) = steps
  step_rewards = used(calls[1])
  assert step["reward_mean"] == pytest.approx(np.mean(step_rewards))
  assert step["accuracy"] == pytest.approx(np.mean([r > 0 for r in step_rewards]))
  nan = sum(r != r for r in calls[1][3])
  assert step["verdict_fn_not_finite"] == nan and step["verdict_scored"] == 8 - nan
  assert step["reward_fn_compute_score"] == pytest.approx(
    np.mean([len(t) % 2 for t in calls[1][0]])
  )
  assert step["reward_info_chars"] == pytest.approx(np.mean([len(t) for t in calls[1][0]]))
  assert step["reward_fn_score"] == pytest.approx(np.mean(used([[""] * 8, 0, 0, calls[1][3]])))
  assert step["prompts_too_long"] == 0
  for i, phase in ((0, "eval_before_rl"), (2, "eval_after_rl")):
    result = json.loads((workdir / phase / "eval.json").read_text())["heldout"]
    assert result["avg@2"][0] == pytest.approx(np.mean([r > 0 for r in used(calls[i])]))


def test_a_reward_that_fails_on_every_response_ends_the_run_in_one_line(tmp_path):
  """A verl-form function written for lists of responses returns a list for each one: it
  fails on all of a call's responses, and the run stops naming it."""
  (tmp_path / "arith_reward.py").write_text(textwrap.dedent(REWARD_MODULE))
  environ = tiny_run.env(tmp_path, REWARD_CALLS=str(tmp_path / "calls.jsonl"))
  flags = [*tiny_run.RAW_PROMPTS_RUN, "--config.rl.steps=1"]
  flags.append("--config.reward.domain=arith_reward:lists_expected")
  flags.append("--config.reward.preflight=False")  # the failure met in a scoring call
  out = tiny_run.launch(tmp_path / "run", *flags, environ=environ, timeout=300)
  assert out.returncode == 1, out.stderr[-3000:]
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith(
    "launch.train: reward.domain: arith_reward:lists_expected failed on all 4 responses of a "
    "scoring call: gave no finite number (response 0: ["
  ), line
  assert "rlvr calls this verl-form function as compute_score(" in line


def test_launch_evaluate_names_a_reward_module_that_does_not_import(tiny_dirs, tmp_path):
  from configs import tiny_rlvr

  c = tiny_rlvr.get_config()
  c.reward.domain = "gone_module:score"
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  (run_dir / "config.json").write_text(json.dumps(c.to_dict(), default=str))
  out = subprocess.run(
    [sys.executable, "-m", "launch.evaluate", f"--run={run_dir}", f"--model={tiny_dirs['qwen2']}"]
    + ["--limit=2"],
    cwd=REPO,
    env=tiny_run.env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 1 and out.stderr.strip().splitlines()[-1:] == [
    "launch.evaluate: reward.domain: cannot load 'gone_module:score': No module named 'gone_module'"
  ], out.stderr[-3000:]
  assert "Traceback" not in out.stderr
