"""Composed arithmetic (Composition-RL by construction) against Python's own evaluation."""

from __future__ import annotations

import random
import re

import pytest

from rlvr.data.tasks import arithmetic, composed

STEP = re.compile(r"(?:([A-Z])=)?(\d+)([+\-*])(\d+)=(\d+)\.")  # "X=3+8=11." or "4*2=8."
RELATION_STEP = re.compile(r"([A-Z])=(\d+)(?:([+\-])(\d+)=(\d+))?\.")  # "Y=11-6=5." or "Y=11."
SENTENCE = re.compile(r"(?:([A-Z])=|Compute )([0-9A-Z+\-*]+)")


def _python_eval(text: str) -> tuple[int, dict[str, int]]:
  """The answer and every named value, by substituting names and evaluating with Python."""
  env: dict[str, int] = {}
  sentences = text.removesuffix(".").split(". ")
  for s in sentences[:-1]:
    name, expression = SENTENCE.fullmatch(s).groups()
    env[name] = eval(expression, {}, dict(env))  # noqa: S307 (our own digits, names, + - *)
  name, expression = SENTENCE.fullmatch(sentences[-1]).groups()
  assert name is None, text
  return eval(expression, {}, dict(env)), env  # noqa: S307


def _draws(depth: int, n: int, seed: int) -> list[composed.ComposedProblem]:
  """n compositions of random distinct components (operands 0..9), seeded."""
  rng = random.Random(seed)
  pool = arithmetic.generate(4 * n * depth, seed=seed, max_operand=9, difficulty=1 + seed % 2)
  out = []
  while len(out) < n:
    chain = rng.sample(pool, depth)
    if len({p.problem for p in chain}) == depth:
      out.append(composed.compose(chain, rng=rng))
  return out


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_answers_match_python_eval(depth):
  problems = _draws(depth, 300, seed=depth)
  problems += composed.make_composed_splits(200, 50, depth, seed=depth)[0]
  for p in problems:
    value, env = _python_eval(p.problem)
    assert p.answer == str(value) == p.components[-1].answer, p
    assert p.depth == len(p.components) == depth
    # The last component's own expression gives the same answer (gt_K).
    assert str(eval(p.components[-1].problem[len("Compute ") : -1])) == p.answer  # noqa: S307
    assert composed.answer_of(p.problem) == p.answer
    # Names in reading order, each replaced variable equal to the constant it replaced.
    assert list(env) == list(composed.NAMES[: 2 * (depth - 1)]), p
    for i, (j, d) in enumerate(zip(p.replaced, p.differences)):
      v1 = int(p.components[i].answer) if i == 0 else env[composed.NAMES[2 * i]]
      v2 = int(re.findall(r"\d+", p.components[i + 1].problem)[j])
      assert env[composed.NAMES[2 * i + 1]] == v2 and d == v1 - v2, p
    assert all(v >= 0 for v in env.values()), p
    assert not re.search(r"(^|[=+\-*(])-", p.problem), p  # no number written with a sign


def test_depth_one_is_the_plain_problem():
  for p in arithmetic.generate(50, seed=5, max_operand=9):
    c = composed.compose([p])
    assert (c.problem, c.solution, c.answer, c.depth, c.components) == (
      p.problem,
      p.solution,
      p.answer,
      1,
      (p,),
    )
  train, heldout = composed.make_composed_splits(100, 20, 1, seed=0)
  for c in train + heldout:
    assert c.components[0].problem == c.problem
    assert arithmetic.answer_of(c.problem) == c.answer == composed.answer_of(c.problem)


def test_the_three_relation_forms_and_worked_example():
  q1, q2, q3 = (
    arithmetic.Problem(f"Compute {e}.", "", str(eval(e)), 1)  # noqa: S307
    for e in ("3+4*2", "5*5-1", "7+2*3")
  )
  c = composed.compose([q1, q2], positions=[0])  # v1 = 11, v2 = 5: d = 6
  assert c.problem == "X=3+4*2. Y=X-6. Compute Y*5-1." and c.answer == "24"
  assert c.solution == "4*2=8. X=3+8=11. Y=11-6=5. 5*5=25. 25-1=24. \\boxed{24}"
  c = composed.compose([q1, q2, q3], positions=[0, 0])
  assert c.problem == "X=3+4*2. Y=X-6. Z=Y*5-1. W=Z-17. Compute W+2*3." and c.answer == "13"
  assert composed.compose([q2, q1], positions=[2]).problem == "X=5*5-1. Y=X-22. Compute 3+4*Y."
  # d < 0 and d = 0.
  small = arithmetic.Problem("Compute 1+1*1.", "", "2", 1)
  assert composed.compose([small, q1], positions=[1]).problem == "X=1+1*1. Y=X+2. Compute 3+Y*2."
  assert composed.compose([small, q3], positions=[1]).problem == "X=1+1*1. Y=X. Compute 7+Y*3."
  with pytest.raises(ValueError, match="positions"):
    composed.compose([q1, q2], positions=[3])
  with pytest.raises(ValueError, match="depth"):
    composed.compose([])


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_worked_solutions_are_correct_steps_ending_in_the_boxed_answer(depth):
  for p in _draws(depth, 200, seed=10 + depth):
    _, env = _python_eval(p.problem)
    assert p.solution.endswith(f" \\boxed{{{p.answer}}}"), p
    steps = p.solution.removesuffix(f" \\boxed{{{p.answer}}}").split(" ")
    named, last = {}, None
    for s in steps:
      if m := STEP.fullmatch(s):
        name, a, op, b, r = m.groups()
        assert eval(f"{a}{op}{b}") == int(r), (p, s)  # noqa: S307
      else:
        m = RELATION_STEP.fullmatch(s)
        assert m, (p, s)
        name, x, op, d, r = m.groups()
        assert int(x) == named[composed.NAMES[composed.NAMES.index(name) - 1]], (p, s)
        r = x if op is None else r
        assert op is None or eval(f"{x}{op}{d}") == int(r), (p, s)  # noqa: S307
      if name:
        named[name] = int(r)
      last = int(r)
    assert named == env and str(last) == p.answer, p
    n_ops = sum(len(re.findall(r"[+\-*]", c.problem)) for c in p.components)
    assert len(steps) == n_ops + depth - 1, p


def test_answer_of_recomputes_or_refuses():
  assert composed.answer_of("Compute 3+4*2.") == "11"
  assert composed.answer_of("X=3+4*2. Y=X-6. Compute Y*5-1.") == "24"
  assert composed.answer_of(" X = 3+4*2 .  Y=X-6. Compute Y * 5 - 1") == "24"
  for text in (
    "",
    "hello",
    "X=2. Compute X+Y.",
    "Y=X+1. Compute Y.",
    "X=1. X=2. Compute X.",
    "X=3+4*2. Compute Y*5-1, where Y=X-6.",
    "X=3+. Compute X.",
    "Compute x+1.",
    "X=3. Compute X. Extra.",
  ):
    assert composed.answer_of(text) is None, text


@pytest.mark.parametrize("depth", [2, 3])
def test_sampling_pools_reuse_and_split_separation(depth):
  pool_size = 20
  train, heldout = composed.make_composed_splits(400, 100, depth, seed=0, pool_size=pool_size)
  assert len(train) == 400 and len(heldout) == 100
  for part, problems in (("train", train), ("heldout", heldout)):
    assert len({p.problem for p in problems}) == len(problems)
    for p in problems:
      texts = [c.problem for c in p.components]
      assert len(set(texts)) == depth, p  # no component twice
      assert all(arithmetic.split(t) == part for t in texts), p
      assert all(int(v) <= 9 for v in re.findall(r"\d+", " ".join(texts)))
    for k in range(depth - 1):  # surrogate pools
      assert len({p.components[k].problem for p in problems}) <= pool_size
    # The answer's position draws from the whole split: far more than a pool.
    assert len({p.components[-1].problem for p in problems}) > min(len(problems), 2 * pool_size)
  assert not {p.problem for p in train} & {p.problem for p in heldout}


def test_deterministic_per_seed():
  a = composed.make_composed_splits(100, 30, 3, seed=1)
  assert a == composed.make_composed_splits(100, 30, 3, seed=1)
  assert a != composed.make_composed_splits(100, 30, 3, seed=2)
  # The held-out set does not depend on how many training problems were asked for.
  assert composed.make_composed_splits(10, 30, 3, seed=1)[1] == a[1]


def test_shortfall_and_bad_arguments_raise():
  with pytest.raises(ValueError, match=r"heldout: \d+ of 100"):
    composed.make_composed_splits(5, 100, 1, seed=0, max_operand=1)
  with pytest.raises(ValueError, match="depth"):
    composed.make_composed_splits(5, 5, 0)
  with pytest.raises(ValueError, match="sizes"):
    composed.make_composed_splits(-1, 5, 2)


def test_prompt_lengths_are_bounded():
  # Operands 0..9, two operations each: X=a?b?c. (8) + each link " Y=X-ddd." (9)
  # + " Z=a?b?c." (9) + " Compute a?b?c." (15); a token covers at least one character.
  bound = {1: 14, 2: 32, 3: 50}
  for depth, most in bound.items():
    train, heldout = composed.make_composed_splits(300, 50, depth, seed=3)
    lengths = [len(p.problem) for p in train + heldout]
    print(
      f"depth {depth}: prompt chars max {max(lengths)} mean {sum(lengths) / len(lengths):.1f}; "
      f"e.g. {train[0].problem!r} -> {train[0].solution!r}"
    )
    assert max(lengths) <= most


def test_to_examples_reports_the_depth():
  for depth in (1, 2, 3):
    train, _ = composed.make_composed_splits(5, 0, depth, seed=0)
    examples = composed.to_examples(train)
    assert [e.source for e in examples] == [f"composed-d{depth}"] * 5
    assert [e.index for e in examples] == list(range(5))
    assert [(e.problem, e.answer, e.solution) for e in examples] == [
      (p.problem, p.answer, p.solution) for p in train
    ]
