"""Nothing a response holds ends a run: a response that cannot be judged scores 0 with its own
verdict, its batch is scored, and the verdict is counted in the step's metrics.

Programs run in the real bubblewrap sandbox; math answers in a real RewardPool."""

from __future__ import annotations

import pytest
from step_context import step_context

from rlvr import rollout
from rlvr.rewards import RewardConfig, code
from rlvr.rewards.equivalence import is_equivalent, normalize_integer
from rlvr.rewards.pool import RewardPool
from rlvr.rewards.verifiers import CodeVerifier, MathVerifier

CFG = code.CodeRewardConfig(
  limits=code.CodeLimits(cpu_s=1, wall_s=2, memory_bytes=256 << 20, file_bytes=1 << 20),
  extraction="whole",
  float_tol=1e-6,
)
DOUBLE = {"fn_name": "f", "inputs": [[2]], "outputs": [4]}
RIGHT = "def f(x):\n  return 2 * x\n"
HOSTILE = {
  # the judge serialises it; the host would parse it on a deeper stack
  "deep": "def f(x):\n  v = x\n  for _ in range(988):\n    v = [v]\n  return v\n",
  # a result line of its own, nested too deep for the judge to read
  "forged": (
    "import os\nos.write(3, b'\\n{\"status\": \"ok\", \"value\": ' + b'[' * 5000 + b']' * 5000"
    " + b'}\\n')\nos._exit(0)\n"
  ),
  # too large for a float: compared exactly under a float tolerance
  "huge": "def f(x):\n  return 10 ** 400\n",
}


@pytest.fixture(scope="module", autouse=True)
def real_sandbox():
  code.check_sandbox("bwrap")  # fails (never skips) where bubblewrap is missing


class _Scoring:
  """A method whose buffer only scores fixed texts: the step's metrics of one score call."""

  name = "scoring"

  def __init__(self, texts, golds):
    self.texts, self.golds = texts, golds

  def buffer(self, ctx, step):
    ctx.score(self.texts, self.golds)
    return [], {}


def _step_metrics(score_fn, texts, golds) -> dict:
  ctx = step_context(None, score_fn)
  return rollout.Buffers(_Scoring(texts, golds), ctx, overlap=False).take(0).metrics


def test_unjudgeable_programs_score_zero_among_normal_ones():
  texts = [RIGHT, HOSTILE["deep"], RIGHT, HOSTILE["forged"], HOSTILE["huge"], RIGHT]
  result = code.score(texts, [DOUBLE] * len(texts), CFG)
  assert result.rewards.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
  reasons = [v.reason for v in result.verdicts]
  assert reasons == ["ok", "judge_error", "ok", "judge_error", "wrong_answer", "ok"]
  assert "deeper than 100 levels" in result.verdicts[1].detail
  assert "too deep to read" in result.verdicts[3].detail
  assert result.reasons == {"ok": 3, "judge_error": 2, "wrong_answer": 1}

  verifier = CodeVerifier(RewardConfig(domain="code", code=CFG))
  metrics = _step_metrics(verifier.score, texts, [DOUBLE] * len(texts))
  assert metrics["verdict_judge_error"] == 2 and metrics["verdict_ok"] == 3
  assert metrics["verdict_wrong_answer"] == 1 and metrics["verdict_sandbox_error"] == 0


def test_comparisons_of_unusual_values():
  assert not code.values_match(10**400, 3, 1e-6) and code.values_match(10**400, 10**400, 1e-6)
  assert code.values_match([10**400, 0.5], [10**400, 0.5000001], 1e-6)
  spec = code.TestSpec("call", ([],), (4,))
  passed, reason, _ = spec.judge(0, {"status": "ok", "value": 10**5000}, 0.1)
  assert (passed, reason) == (False, "wrong_answer")  # its detail cannot show 5000 digits


def flaky_judge(pred, gold, integer_answers, timeout_s):
  """A math judge that raises on the answer "raise", else math-verify."""
  if pred == "raise":
    raise ValueError("the judge failed on this answer")
  return is_equivalent(pred, gold, integer_answers, timeout_s)


def test_math_answers_that_break_a_judge_score_zero_among_normal_ones():
  huge = "9" * 5000  # more digits than int() takes from a string
  texts = [r"\boxed{2}", r"\boxed{raise}", rf"\boxed{{{huge}}}", r"\boxed{x+1}", r"\boxed{3}"]
  golds = ["2", "1/9", "5", "1+x", huge]
  with RewardPool(workers=1, timeout_s=5.0, judge=flaky_judge) as pool:
    verifier = MathVerifier(RewardConfig(), pool)
    rewards, correct = verifier.score(texts, golds)
    assert rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert correct.tolist() == [True, False, False, True, False]
    metrics = _step_metrics(verifier.score, texts, golds)
    integers = MathVerifier(RewardConfig(integer_answers=True), pool)
    assert integers.well_formed(rf"\boxed{{{huge}}}") and not integers.well_formed(r"\boxed{x}")
  assert metrics["verdict_judge_error"] == 1 and metrics["verdict_timeout"] == 0


def test_integers_of_any_length_normalise_without_int():
  assert normalize_integer("0" * 3 + "9" * 5000) == "9" * 5000
  assert [normalize_integer(s) for s in ("-0", "+007", "-012", "1{,}000", "0")] == [
    "0",
    "7",
    "-12",
    "1000",
    "0",
  ]
  assert normalize_integer("1.5") is None
