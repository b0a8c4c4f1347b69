"""Procedural multi-step integer arithmetic: the embedded default's task.

A ~1M-parameter model on 2 CPU cores learns this in minutes
(docs/architecture.md#embedded-default), and its answers are exact, so the whole RLVR / SvS
pipeline runs end to end without a hub or a large model.

- Problems: "Compute 12+7*3." with difficulty + 1 operations (d=1: 2, d=2: 3)
  over operands 0..max_operand (20 by default at every difficulty), operators
  + - * with the usual precedence, no division.
- No negative numbers anywhere: expressions whose final or any intermediate
  step result would be negative are redrawn, so the tiny model never has to
  write a minus sign as a number's sign. (This skews the draw slightly away
  from subtractions of large products.)
- Solutions evaluate one operation per step in precedence order, products
  first, then sums and differences left to right: "7*3=21. 12+21=33. \\boxed{33}".
  They stay short because the response budget is ~48 tokens and every digit is
  its own token.
- Train / held-out membership is a hash of the problem text, not of the seed,
  so no seed can leak a held-out problem into training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator

from rlvr.data.readers import Example

OPERATORS = ("+", "-", "*")
MAX_OPERAND = 20
HELDOUT_FRACTION = 0.1
_HASH_BUCKETS = 10_000
# Our own short wording of SvS's synthesis task (the model is tiny).
INVERSE_TEMPLATE = (
  "<response>{solution}</response>\n"
  "Write the problem this correct solution solves, in a ```text block."
)


@dataclasses.dataclass(frozen=True)
class Problem:
  problem: str
  solution: str
  answer: str
  difficulty: int


def num_operations(difficulty: int) -> int:
  if difficulty < 1:
    raise ValueError(f"difficulty: must be >= 1, got {difficulty}")
  return difficulty + 1


def _apply(a: int, op: str, b: int) -> int:
  return a + b if op == "+" else a - b if op == "-" else a * b


def solve(operands: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
  """The steps (a, op, b, result), one operation each, in precedence order."""
  values, ops, steps = list(operands), list(ops), []
  while ops:
    i = ops.index("*") if "*" in ops else 0
    a, op, b = values[i], ops[i], values[i + 1]
    result = _apply(a, op, b)
    steps.append((a, op, b, result))
    values[i : i + 2] = [result]
    del ops[i]
  return steps


def _render(operands: list[int], ops: list[str], steps, difficulty: int) -> Problem:
  expression = "".join(f"{v}{op}" for v, op in zip(operands, ops)) + str(operands[-1])
  answer = str(steps[-1][3])
  worked = " ".join(f"{a}{op}{b}={r}." for a, op, b, r in steps)
  return Problem(
    problem=f"Compute {expression}.",
    solution=f"{worked} \\boxed{{{answer}}}",
    answer=answer,
    difficulty=difficulty,
  )


def _draw(rng: random.Random, difficulty: int, max_operand: int) -> Problem:
  n_ops = num_operations(difficulty)
  while True:
    operands = [rng.randint(0, max_operand) for _ in range(n_ops + 1)]
    ops = [rng.choice(OPERATORS) for _ in range(n_ops)]
    steps = solve(operands, ops)
    if all(r >= 0 for *_, r in steps):
      return _render(operands, ops, steps, difficulty)


def _stream(difficulty: int, seed: int, max_operand: int) -> Iterator[Problem]:
  num_operations(difficulty)  # validate before the first draw
  if max_operand < 1:
    raise ValueError(f"max_operand: must be >= 1, got {max_operand}")
  # A str seed is hashed by random.Random itself: stable across runs and platforms.
  rng = random.Random(f"arithmetic:{seed}:{difficulty}:{max_operand}")
  while True:
    yield _draw(rng, difficulty, max_operand)


def generate(
  n: int, *, difficulty: int = 1, seed: int = 0, max_operand: int = MAX_OPERAND
) -> list[Problem]:
  """n random problems (repeats possible, splits ignored); deterministic for a seed."""
  return list(itertools.islice(_stream(difficulty, seed, max_operand), n))


def split(problem: Problem | str) -> str:
  """ "train" or "heldout", from a hash of the problem text (independent of any seed)."""
  text = problem.problem if isinstance(problem, Problem) else problem
  bucket = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
  return "heldout" if bucket % _HASH_BUCKETS < HELDOUT_FRACTION * _HASH_BUCKETS else "train"


def make_splits(
  n_train: int,
  n_heldout: int,
  difficulty: int = 1,
  seed: int = 0,
  *,
  max_operand: int = MAX_OPERAND,
) -> tuple[list[Problem], list[Problem]]:
  """Distinct train and held-out problems, drawn from one stream until both are full.

  Raises ValueError when the problem space is too small to fill them (bounded draws).
  """
  if n_train < 0 or n_heldout < 0:
    raise ValueError(
      f"make_splits: sizes must be >= 0, got n_train={n_train}, n_heldout={n_heldout}"
    )
  want = {"train": n_train, "heldout": n_heldout}
  out: dict[str, list[Problem]] = {"train": [], "heldout": []}
  seen: set[str] = set()
  max_draws = 100 * (n_train + n_heldout) + 10_000
  for problem in itertools.islice(_stream(difficulty, seed, max_operand), max_draws):
    if all(len(out[s]) >= want[s] for s in want):
      break
    part = split(problem)
    if problem.problem not in seen and len(out[part]) < want[part]:
      seen.add(problem.problem)
      out[part].append(problem)
  short = [f"{s}: {len(out[s])} of {want[s]}" for s in want if len(out[s]) < want[s]]
  if short:
    raise ValueError(
      f"make_splits: only found distinct problems for {', '.join(short)} after "
      f"{max_draws} draws (difficulty {difficulty}, max_operand {max_operand})"
    )
  return out["train"], out["heldout"]


_PROBLEM = re.compile(r"\s*Compute\s+(\d+(?:\s*[-+*]\s*\d+)*)\s*\.?\s*")


def answer_of(problem_text: str) -> str | None:
  """The exact answer of a problem written as "Compute <expression>." (our own
  format), or None for any other text, e.g. a synthesized problem that drifted.

  SvS never sees this (its synthetic problems are scored against the original
  answer only); it is a diagnostic of how often an accepted synthesis is
  actually consistent with that answer.
  """
  m = _PROBLEM.fullmatch(problem_text)
  if m is None:
    return None
  tokens = re.findall(r"\d+|[-+*]", m.group(1))
  operands, ops = [int(t) for t in tokens[::2]], tokens[1::2]
  if not ops:
    return str(operands[0])
  return str(solve(operands, ops)[-1][3])


def inverse_pair(problem: Problem) -> tuple[str, str]:
  """(prompt, target) of SvS's synthesis task: recover the problem from its solution."""
  return (INVERSE_TEMPLATE.format(solution=problem.solution), f"```text\n{problem.problem}\n```")


def program_tests(answer: str | None) -> str | None:
  """The code-domain reference of an answer: a program given no input must print it."""
  return None if answer is None else json.dumps({"inputs": [""], "outputs": [answer]})


def as_program(problem: Problem) -> Problem:
  """The problem answered by a program (reward.domain = "code"): the same worked steps, then
  a one-line program that prints the result; the reference answer is that program's test."""
  worked = problem.solution.rsplit(" \\boxed", 1)[0]
  return dataclasses.replace(
    problem,
    solution=f"{worked}\n```python\nprint({problem.answer})\n```",
    answer=program_tests(problem.answer),
  )


def with_tool(problem: Problem) -> Problem:
  """The problem worked with the python tool (`env.name = "python_tool"`): a block that
  prints the expression, its output as the tool returns it, then the boxed answer. The
  reference answer stays the number."""
  expression = problem.problem.removeprefix("Compute ").rstrip(".")
  return dataclasses.replace(
    problem,
    solution=(
      f"```python\nprint({expression})\n```\n```output\n{problem.answer}\n```\n"
      f"\\boxed{{{problem.answer}}}"
    ),
  )


def to_examples(problems: Iterable[Problem]) -> list[Example]:
  return [
    Example(
      problem=p.problem,
      answer=p.answer,
      source=f"arithmetic-d{p.difficulty}",
      index=i,
      solution=p.solution,
    )
    for i, p in enumerate(problems)
  ]
