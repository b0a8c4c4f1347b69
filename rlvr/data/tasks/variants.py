"""A procedural QbQ teacher for the arithmetic task: variants with exact answers.

QbQ's teacher rewrites a seed problem by one of five operators
(docs/methods.md#operators). For "Compute <expression>." problems each operator has an analogue
that keeps the seed's skill (evaluating + - * with precedence) and changes the
structure, so the whole QbQ loop runs on CPU without a teacher model:

  O1 generalize-then-specialize  one operator of the seed changes (a new regime
                                 of the same rule: 3+4*2 -> 3*4*2);
  O2 parametrize-and-sum         one operand v becomes a parameter and the
                                 variant asks for E(v) + E(v+1);
  O3 change the queried quantity the value of the seed's expression without its
                                 last operation (an intermediate quantity);
  O4 inverse problem             the result is given and one operand is asked
                                 for: "Solve 3+x*2=11 for x." (unique in 0..99);
  O5 add a constraint layer      one more operation on the seed's result:
                                 "Compute (3+4*2)*3." written without brackets
                                 only when precedence keeps the meaning.

A variant is dropped (the teacher abstains) when the operator does not apply,
an intermediate result would be negative (the task never has negatives), or
the answer equals the seed's (QbQ rejects those anyway). Draws come from
`random.Random` seeded by the seed text, operator and round, so a rerun makes
the same variants.
"""

from __future__ import annotations

import random
import re

from rlvr.data.tasks import arithmetic

OPERATOR_IDS = ("O1", "O2", "O3", "O4", "O5")
_COMPUTE = re.compile(r"\s*Compute\s+(\d+(?:\s*[-+*]\s*\d+)*)\s*\.?\s*")
_SOLVE_RANGE = 100  # an inverse problem must have exactly one solution in 0..99


def parse(problem_text: str) -> tuple[list[int], list[str]] | None:
  """(operands, operators) of "Compute <expression>.", else None."""
  m = _COMPUTE.fullmatch(problem_text)
  if m is None:
    return None
  tokens = re.findall(r"\d+|[-+*]", m.group(1))
  return [int(t) for t in tokens[::2]], tokens[1::2]


def _expr(operands, ops) -> str:
  return "".join(f"{v}{op}" for v, op in zip(operands, ops)) + str(operands[-1])


def _value(operands, ops) -> int | None:
  """The expression's value, or None when a step goes negative."""
  if not ops:
    return operands[0]
  steps = arithmetic.solve(list(operands), list(ops))
  return steps[-1][3] if all(r >= 0 for *_, r in steps) else None


def _compute(operands, ops) -> tuple[str, str] | None:
  v = _value(operands, ops)
  return None if v is None else (f"Compute {_expr(operands, ops)}.", str(v))


def _o1(rng, operands, ops):
  if not ops:
    return None
  i = rng.randrange(len(ops))
  new = list(ops)
  new[i] = rng.choice([o for o in arithmetic.OPERATORS if o != ops[i]])
  return _compute(operands, new)


def _o2(rng, operands, ops):
  i = rng.randrange(len(operands))
  shifted = list(operands)
  shifted[i] += 1
  return _compute(operands + shifted, ops + ["+"] + ops)


def _o3(rng, operands, ops):
  del rng
  if len(ops) < 2:
    return None
  return _compute(operands[:-1], ops[:-1])


def _o4(rng, operands, ops):
  result = _value(operands, ops)
  if result is None:
    return None
  i = rng.randrange(len(operands))
  solutions = [
    x for x in range(_SOLVE_RANGE) if _value(operands[:i] + [x] + operands[i + 1 :], ops) == result
  ]
  if solutions != [operands[i]]:
    return None
  text = _expr(operands[:i] + ["x"] + operands[i + 1 :], ops)
  return f"Solve {text}={result} for x.", str(operands[i])


def _o5(rng, operands, ops):
  op = rng.choice(arithmetic.OPERATORS)
  # "E*d" would multiply only E's last term: allowed when E has no + or - (same meaning).
  if op == "*" and any(o != "*" for o in ops):
    op = "+"
  return _compute(operands + [rng.randint(1, 9)], ops + [op])


_APPLY = {"O1": _o1, "O2": _o2, "O3": _o3, "O4": _o4, "O5": _o5}


def plan(problem_text: str, n: int = 3, salt: str = "") -> tuple[str, ...]:
  """n distinct operators for a seed, drawn deterministically from its text."""
  rng = random.Random(f"qbq-plan:{salt}:{problem_text}")
  return tuple(rng.sample(OPERATOR_IDS, n))


def variant(
  problem_text: str, answer: str, operator: str, salt: str = ""
) -> tuple[str, str] | None:
  """(statement, exact answer) of one operator applied to a seed, or None (abstain)."""
  if operator not in _APPLY:
    raise ValueError(f"operator: unknown {operator!r}; expected one of {OPERATOR_IDS}")
  parsed = parse(problem_text)
  if parsed is None:
    return None
  rng = random.Random(f"qbq-variant:{salt}:{operator}:{problem_text}")
  out = _APPLY[operator](rng, *parsed)
  if out is None or out[1] == answer.strip():
    return None
  return out
