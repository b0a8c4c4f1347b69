"""The procedural arithmetic task against Python's own evaluation of each expression."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rlvr.data import prompts
from rlvr.data.tasks import arithmetic

STEP = re.compile(r"(\d+)([+\-*])(\d+)=(\d+)\.")


def _expression(p: arithmetic.Problem) -> str:
  return p.problem.removeprefix("Compute ").removesuffix(".")


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_answers_match_python_eval(difficulty):
  problems = arithmetic.generate(1000, difficulty=difficulty, seed=difficulty)
  for p in problems:
    assert p.answer == str(eval(_expression(p))), p  # noqa: S307 (our own digits and + - *)
    assert p.difficulty == difficulty
    assert re.fullmatch(r"Compute \d+([+\-*]\d+)+\.", p.problem), p


@pytest.mark.parametrize("difficulty", [1, 2])
def test_solutions_are_correct_steps_ending_in_the_boxed_answer(difficulty):
  for p in arithmetic.generate(1000, difficulty=difficulty, seed=7):
    assert p.solution.endswith(f" \\boxed{{{p.answer}}}"), p
    steps = STEP.findall(p.solution)
    assert len(steps) == arithmetic.num_operations(difficulty), p
    for a, op, b, r in steps:
      assert eval(f"{a}{op}{b}") == int(r), p  # noqa: S307
    assert steps[-1][3] == p.answer
    # Products come first: no step after a +/- step is a product.
    ops = [op for _, op, _, _ in steps]
    assert ops == sorted(ops, key=lambda o: o != "*"), p
    assert "-" not in p.answer and all(int(v) <= 20 for v in re.findall(r"\d+", _expression(p)))


def test_difficulty_sets_the_number_of_operations():
  for d in (1, 2, 3):
    counts = {
      len(re.findall(r"[+\-*]", _expression(p)))
      for p in arithmetic.generate(200, difficulty=d, seed=0)
    }
    assert counts == {d + 1}
  with pytest.raises(ValueError, match="difficulty"):
    arithmetic.generate(1, difficulty=0)


def test_generate_is_deterministic_per_seed():
  assert arithmetic.generate(50, seed=3) == arithmetic.generate(50, seed=3)
  assert arithmetic.generate(50, seed=3) != arithmetic.generate(50, seed=4)
  # All three operators occur, with products worked before sums.
  text = " ".join(p.problem for p in arithmetic.generate(200, seed=0))
  assert all(op in text for op in arithmetic.OPERATORS)


def test_splits_are_disjoint_distinct_and_stable_across_seeds():
  train0, held0 = arithmetic.make_splits(2000, 200, difficulty=1, seed=0)
  train1, held1 = arithmetic.make_splits(2000, 200, difficulty=1, seed=1)
  assert len(train0) == 2000 and len(held0) == 200
  for train, held in ((train0, held0), (train1, held1)):
    names = [p.problem for p in train + held]
    assert len(set(names)) == len(names)
    assert all(arithmetic.split(p) == "train" for p in train)
    assert all(arithmetic.split(p) == "heldout" for p in held)
  train_all = {p.problem for p in train0 + train1}
  assert not train_all & {p.problem for p in held0 + held1}
  # Membership is a function of the text alone, pinned so it never drifts.
  assert arithmetic.split("Compute 12+7*3.") == arithmetic.split(
    arithmetic.Problem("Compute 12+7*3.", "", "33", 1)
  )
  fraction = np.mean([arithmetic.split(p) == "heldout" for p in arithmetic.generate(5000, seed=9)])
  assert abs(fraction - arithmetic.HELDOUT_FRACTION) < 0.02


def test_make_splits_fails_clearly_when_the_space_is_too_small():
  # max_operand 1, one operation pair: at most 2*2*2*9 = 72 distinct problems.
  with pytest.raises(ValueError, match="heldout: .* of 500"):
    arithmetic.make_splits(10, 500, difficulty=1, seed=0, max_operand=1)


def test_inverse_pair_and_examples():
  (p,) = arithmetic.generate(1, seed=0)
  prompt, target = arithmetic.inverse_pair(p)
  assert f"<response>{p.solution}</response>" in prompt and "```text" in prompt
  assert target == f"```text\n{p.problem}\n```"
  (e,) = arithmetic.to_examples([p])
  assert (e.problem, e.answer, e.solution, e.index, e.source) == (
    p.problem,
    p.answer,
    p.solution,
    0,
    "arithmetic-d1",
  )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from rlvr.model import train_tokenizer

  return train_tokenizer(str(tmp_path_factory.mktemp("tok")))


def test_token_lengths_fit_the_tiny_budget(tokenizer):
  """Prints typical lengths; the solution (+ end token) must fit a 48-token response."""
  rows = []
  for d in (1, 2):
    problems = arithmetic.generate(500, difficulty=d, seed=0)
    bare = [len(prompts.format_prompt(tokenizer, p.problem, instruction="")) for p in problems]
    instr = [len(prompts.format_prompt(tokenizer, p.problem)) for p in problems]
    sol = [len(tokenizer(p.solution)["input_ids"]) + 1 for p in problems]  # + <|im_end|>
    inv_p = [
      len(prompts.format_prompt(tokenizer, arithmetic.inverse_pair(p)[0], instruction=""))
      for p in problems
    ]
    inv_t = [len(tokenizer(arithmetic.inverse_pair(p)[1])["input_ids"]) + 1 for p in problems]
    for name, xs in (
      ("prompt (no instruction)", bare),
      ("prompt (DEFAULT_INSTRUCTION)", instr),
      ("solution + eos", sol),
      ("inverse prompt", inv_p),
      ("inverse target + eos", inv_t),
    ):
      rows.append(
        f"d={d} {name:28s} mean {np.mean(xs):5.1f}  median {np.median(xs):4.0f}  max {max(xs)}"
      )
    if d == 1:
      assert max(sol) <= 48 and max(inv_t) <= 48
  print("\n" + "\n".join(rows))


def test_answer_of_recomputes_our_problems_and_rejects_drifted_text():
  problems = arithmetic.generate(200, difficulty=2, seed=5)
  assert all(arithmetic.answer_of(p.problem) == p.answer for p in problems)
  assert arithmetic.answer_of("Compute 12+7*3.") == "33"
  assert arithmetic.answer_of("Compute 2*3*4+1") == "25"  # period optional
  assert arithmetic.answer_of("Compute 3-4*2.") == "-5"  # negatives are fine here
  assert arithmetic.answer_of("Compute 7.") == "7"
  for drifted in (
    "Compute x+1.",
    "Compute 1+2. Then 3.",
    "compute 1+2.",
    "1+2",
    "Compute 1++2.",
    "",
  ):
    assert arithmetic.answer_of(drifted) is None, drifted
