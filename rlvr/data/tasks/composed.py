"""Composition-RL's sequential prompt composition of the arithmetic task, by construction.

Composition-RL (docs/methods.md#compose) composes problems with an assistant LLM and then
verifies each step; here the components are our own arithmetic problems, so the
three steps are done exactly in code and nothing needs verifying. The depth
curriculum (1 -> 2 -> 3) then runs end to end on CPU. `synthesis/composition.py`
is the assistant-driven version for real data sets.

Rules (the compact form the tiny embedded model can read; every digit is a token):
- Depth 1 is the plain arithmetic problem, solution and answer unchanged.
- Compose(q1, q2): v1 is the answer of q1 (one integer); the definition d1 is
  "X=<q1's expression>."; v2 is one operand of q2, picked by a seeded uniform
  choice over its operand positions (or given as `positions`), and is replaced by
  the variable Y; the relation from d = v1 - v2 is "Y=X-d." when d > 0,
  "Y=X+|d|." when d < 0 and "Y=X." when d = 0. The text is q1 + d1, then the
  relation, then q2' (the paper's order, one sentence each):
      "X=3+4*2. Y=X-6. Compute Y*5-1."                      answer 24 (= gt2)
- Depth K, SPC(q1..qK) = Compose(q1, SPC(q2..qK)), reads as a chain in which
  each link defines the next name from its result; the answer is gt_K:
      "X=3+4*2. Y=X-6. Z=Y*5-1. W=Z-7. Compute W+2*3."      answer 23
  Names come in reading order from NAMES (X, Y, Z, W, U, V, ...): component k
  defines NAMES[2k] and uses NAMES[2k-1]. The problems hold only digits,
  operators, "Compute" and these single capitals, so no name can clash.
- No negative numbers anywhere: Y = X -/+ |d| equals v2, an operand (>= 0), d is
  written as a magnitude with the sign in the operator, and every other step is
  a component's own step (arithmetic.py already redraws negative ones).
- Worked solution (SFT), the task's step format: each component's steps in
  precedence order with its value's name on its last step, then the relation
  with X's value substituted, then the next component's steps with Y's value
  substituted (they are its original steps), ending in the boxed answer:
      "4*2=8. X=3+8=11. Y=11-6=5. 5*5=25. 25-1=24. \\boxed{24}".
- Sampling (`make_composed_splits`): each split's components are the distinct
  arithmetic problems of that split (`arithmetic.split`, hash of the text) from
  the seed's arithmetic stream, so a held-out composed problem uses only held-out
  components and a training one only training components. Positions 1..K-1 draw
  from surrogate pools of `pool_size` components per position (paper: 20),
  position K from the split's whole component set, cycled in shuffled order so
  the answer's position gets full diversity; no component twice in one chain;
  composed texts are distinct within a split.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from collections.abc import Iterable, Sequence

from rlvr.data.readers import Example
from rlvr.data.tasks import arithmetic

# Single capitals in reading order; no C (Compute), I, L, O (look like 1, 0).
NAMES = "XYZWUVPQRSTABDEFGHJKMN"
MAX_DEPTH = len(NAMES) // 2 + 1
SPLITS = ("train", "heldout")
_MAX_MISSES = 2_000  # draws in a row without a new composition: the space is exhausted


@dataclasses.dataclass(frozen=True)
class ComposedProblem:
  problem: str
  solution: str
  answer: str
  depth: int
  components: tuple[arithmetic.Problem, ...]  # q1..qK in reading order
  replaced: tuple[int, ...] = ()  # operand index of q2..qK turned into a variable
  differences: tuple[int, ...] = ()  # d = v1 - v2 of each link


# ------------------------------------------------------------------ composing
_COMPONENT = re.compile(r"Compute (\d+(?:[-+*]\d+)+)\.")


def _parse(p: arithmetic.Problem) -> tuple[list[int], list[str]]:
  m = _COMPONENT.fullmatch(p.problem)
  if m is None:
    raise ValueError(f"compose: not an arithmetic problem with an operator: {p.problem!r}")
  tokens = re.findall(r"\d+|[-+*]", m.group(1))
  return [int(t) for t in tokens[::2]], tokens[1::2]


def _relation(y: str, x: str, x_value: int, d: int) -> tuple[str, str]:
  """(problem sentence, solution step) of "y is x less d"; d = x_value - value of y."""
  if d == 0:
    return f"{y}={x}.", f"{y}={x_value}."
  op, mag = ("-", d) if d > 0 else ("+", -d)
  return f"{y}={x}{op}{mag}.", f"{y}={x_value}{op}{mag}={x_value - d}."


def compose(
  problems: Sequence[arithmetic.Problem],
  *,
  positions: Sequence[int] | None = None,
  rng: random.Random | None = None,
) -> ComposedProblem:
  """SPC(q1..qK) for K = len(problems), answer gt_K (rules in the module docstring).

  positions: the operand index of q2..qK to replace; else drawn from `rng`, else
  from a generator seeded by the component texts (the same chain composes alike).
  """
  k = len(problems)
  if not 1 <= k <= MAX_DEPTH:
    raise ValueError(f"compose: depth must be in 1..{MAX_DEPTH}, got {k}")
  if k == 1:
    p = problems[0]
    return ComposedProblem(p.problem, p.solution, p.answer, 1, (p,))
  parsed = [_parse(p) for p in problems]
  if positions is None:
    rng = rng or random.Random("compose:" + "|".join(p.problem for p in problems))
    positions = [rng.randrange(len(operands)) for operands, _ in parsed[1:]]
  if len(positions) != k - 1 or any(
    not 0 <= j < len(o) for j, (o, _) in zip(positions, parsed[1:])
  ):
    raise ValueError(f"compose: positions {list(positions)} do not fit operands of q2..q{k}")
  sentences, steps, diffs, value = [], [], [], 0
  for i, (operands, ops) in enumerate(parsed):
    terms = [str(v) for v in operands]
    if i:
      j = positions[i - 1]
      d = value - operands[j]
      sentence, step = _relation(NAMES[2 * i - 1], NAMES[2 * i - 2], value, d)
      sentences.append(sentence)
      steps.append(step)
      diffs.append(d)
      terms[j] = NAMES[2 * i - 1]
    expression = "".join(t + op for t, op in zip(terms, ops)) + terms[-1]
    last = i == k - 1
    sentences.append(f"Compute {expression}." if last else f"{NAMES[2 * i]}={expression}.")
    worked = [f"{a}{op}{b}={r}." for a, op, b, r in arithmetic.solve(operands, ops)]
    if not last:
      worked[-1] = f"{NAMES[2 * i]}={worked[-1]}"
    steps += worked
    value = arithmetic.solve(operands, ops)[-1][3]
  answer = str(value)
  assert answer == problems[-1].answer, (problems, answer)
  return ComposedProblem(
    " ".join(sentences),
    " ".join(steps) + f" \\boxed{{{answer}}}",
    answer,
    k,
    tuple(problems),
    tuple(positions),
    tuple(diffs),
  )


# ------------------------------------------------------------------ recomputation
_TERM = r"(?:\d+|[A-Z])"
_EXPR = rf"{_TERM}(?:\s*[-+*]\s*{_TERM})*"
_DEFINITION = re.compile(rf"\s*([A-Z])\s*=\s*({_EXPR})\s*\.")
_QUESTION = re.compile(rf"\s*Compute\s+({_EXPR})\s*\.?\s*")


def _evaluate(expression: str, env: dict[str, int]) -> int | None:
  tokens = re.findall(r"\d+|[A-Z]|[-+*]", expression)
  values = [int(t) if t.isdigit() else env.get(t) for t in tokens[::2]]
  if any(v is None for v in values):
    return None
  ops = tokens[1::2]
  return arithmetic.solve(values, ops)[-1][3] if ops else values[0]


def answer_of(text: str) -> str | None:
  """The exact answer of a problem in this format, "<N>=<expr>. ... Compute <expr>."
  (depth 1 included: a plain "Compute <expr>."), by evaluating each definition in
  order; None for other text, a name used before it is defined, or one defined twice."""
  env: dict[str, int] = {}
  pos = 0
  while (m := _DEFINITION.match(text, pos)) is not None:
    name, value = m.group(1), _evaluate(m.group(2), env)
    if name in env or value is None:
      return None
    env[name], pos = value, m.end()
  m = _QUESTION.fullmatch(text, pos)
  value = None if m is None else _evaluate(m.group(1), env)
  return None if value is None else str(value)


# ------------------------------------------------------------------ sampling
def _components(
  want: dict[str, int], difficulty: int, seed: int, max_operand: int
) -> dict[str, list[arithmetic.Problem]]:
  """Up to want[s] distinct problems of each split, in the order of the seed's
  arithmetic stream (the task's own make_splits order); fewer if draws run out."""
  out: dict[str, list[arithmetic.Problem]] = {s: [] for s in SPLITS}
  seen: set[str] = set()
  max_draws = 100 * sum(want.values()) + 10_000
  stream = arithmetic._stream(difficulty, seed, max_operand)  # noqa: SLF001 (same package)
  for problem in itertools.islice(stream, max_draws):
    if all(len(out[s]) >= want[s] for s in SPLITS):
      break
    part = arithmetic.split(problem)
    if problem.problem not in seen and len(out[part]) < want[part]:
      seen.add(problem.problem)
      out[part].append(problem)
  return out


def _compose_split(
  components: list[arithmetic.Problem], n: int, depth: int, pool_size: int, rng: random.Random
) -> list[ComposedProblem]:
  """Up to n distinct compositions: pools for positions 1..K-1, every component at K."""
  if n == 0 or len(components) < depth:
    return []
  pools = [rng.sample(components, min(pool_size, len(components))) for _ in range(depth - 1)]
  out, seen, order, misses = [], set(), [], 0
  for _ in range(100 * n + 10_000):
    if len(out) >= n or misses >= _MAX_MISSES:
      break
    if not order:
      order = rng.sample(components, len(components))
    chain = [rng.choice(pool) for pool in pools] + [order.pop()]
    composed = compose(chain, rng=rng) if len({p.problem for p in chain}) == depth else None
    if composed is None or composed.problem in seen:
      misses += 1
      continue
    seen.add(composed.problem)
    out.append(composed)
    misses = 0
  return out


def make_composed_splits(
  n_train: int,
  n_heldout: int,
  depth: int,
  seed: int = 0,
  max_operand: int = 9,
  pool_size: int = 20,
  *,
  difficulty: int = 1,
  n_components: int | None = None,
) -> tuple[list[ComposedProblem], list[ComposedProblem]]:
  """Distinct train and held-out depth-`depth` problems; deterministic for a seed.

  n_components: size of each split's component set (position K draws from all of
  it); default max(n wanted in that split, pool_size). Raises ValueError naming
  the shortfall when the component space is too small to fill a split.
  """
  if n_train < 0 or n_heldout < 0:
    raise ValueError(
      f"make_composed_splits: sizes must be >= 0, got n_train={n_train}, n_heldout={n_heldout}"
    )
  if not 1 <= depth <= MAX_DEPTH:
    raise ValueError(f"make_composed_splits: depth must be in 1..{MAX_DEPTH}, got {depth}")
  if pool_size < 1 or (n_components is not None and n_components < 1):
    raise ValueError(
      f"make_composed_splits: pool_size and n_components must be >= 1, got "
      f"{pool_size}, {n_components}"
    )
  want = {"train": n_train, "heldout": n_heldout}
  comp_want = {
    s: (0 if not want[s] else n_components if n_components is not None else max(want[s], pool_size))
    for s in SPLITS
  }
  components = _components(comp_want, difficulty, seed, max_operand)
  out = {
    s: _compose_split(
      components[s],
      want[s],
      depth,
      pool_size,
      random.Random(f"composed:{seed}:{s}:{depth}:{difficulty}:{max_operand}:{pool_size}"),
    )
    for s in SPLITS
  }
  short = [
    f"{s}: {len(out[s])} of {want[s]} (from {len(components[s])} distinct components)"
    for s in SPLITS
    if len(out[s]) < want[s]
  ]
  if short:
    raise ValueError(
      f"make_composed_splits: only found distinct depth-{depth} problems for "
      f"{', '.join(short)} (difficulty {difficulty}, max_operand {max_operand}, "
      f"pool_size {pool_size})"
    )
  return out["train"], out["heldout"]


def to_examples(problems: Iterable[ComposedProblem]) -> list[Example]:
  return [
    Example(
      problem=p.problem,
      answer=p.answer,
      source=f"composed-d{p.depth}",
      index=i,
      solution=p.solution,
    )
    for i, p in enumerate(problems)
  ]
