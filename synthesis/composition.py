"""Composition-RL's sequential prompt composition (docs/methods.md#composition-rl), pure.

Compose(q1, q2; gt1, gt2) -> (q12, gt2) in three assistant steps, each checked:
  1. define: a number v1 of gt1 becomes a variable X with a definition d1 in words;
  2. replace: a numeric constant v2 of q2 becomes a variable Y, giving q2';
  3. relate: a sentence stating Y through X from v1 - v2;
  q12 = q1 + d1 + relation + q2', answer gt2.
Verification, each its own assistant call: V1 recomputes X from q1 and d1, V2
recovers the constant Y replaced, V3 checks the whole problem (relation, names);
the code itself checks tags, numbers, v1 in gt1, v2 in q2, name clashes and
the relation's arithmetic. Depth K: SPC(q1..qK) = Compose(q1, SPC(q2..qK)).

The assistant enters as `complete(prompts) -> texts` and answer equivalence as
`equivalent(a, b) -> bool` (the trainer passes math-verify), so this module
imports nothing of the project. Rules the paper leaves open:
- v1 must be one of the numbers written in gt1 (for "(2, 3)" either 2 or 3); an
  answer with no number cannot be a first problem;
- the relation states Y through X: "Y is d less than X" when v1 - v2 = d > 0,
  "Y is |d| more than X" when d < 0, "Y equals X" when d = 0; the assistant
  words it, the code checks the difference it reports;
- a rejection is final for that chain (no retry); reasons are counted.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from fractions import Fraction
from typing import Callable, Sequence

from synthesis.numbers import (
  clashes,
  default_equivalent,
  format_number,
  numbers_in,
  parse_number,
  symbols,
  valid_name,
)

_PROMPTS = os.path.join(os.path.dirname(__file__), "prompts")
Complete = Callable[[list[str]], list[str]]


def _template(name: str) -> str:
  with open(os.path.join(_PROMPTS, f"composition_{name}.txt")) as f:
    return f.read()


@dataclasses.dataclass(frozen=True)
class Problem:
  text: str
  answer: str
  id: str = ""
  source: str = ""


@dataclasses.dataclass(frozen=True)
class Composed:
  """q12 with provenance: the ids composed (outermost first), depth, v1, v2, relation."""

  problem: Problem
  ids: tuple[str, ...]
  depth: int
  v1: str
  v2: str
  x: str
  y: str
  relation: str


@dataclasses.dataclass(frozen=True)
class Outcome:
  composed: Composed | None
  reason: str  # "accepted", or why the chain was rejected
  stage: str = ""  # define / replace / relate / v1 / v2 / v3


# ------------------------------------------------------------------ parsing
def tag(text: str, name: str) -> str | None:
  """Content of the last <name>...</name> in text (chatter around it is fine)."""
  found = re.findall(rf"<{name}>(.*?)</{name}>", text, re.DOTALL | re.IGNORECASE)
  return found[-1].strip() if found else None


# ------------------------------------------------------------------ one composition
@dataclasses.dataclass
class _Work:
  q1: Problem
  q2: Problem
  x: str = ""
  v1: Fraction | None = None
  definition: str = ""
  y: str = ""
  v2: Fraction | None = None
  rewritten: str = ""
  relation: str = ""
  reason: str = ""
  stage: str = ""

  def reject(self, stage: str, reason: str) -> None:
    self.stage, self.reason = stage, reason

  @property
  def text(self) -> str:
    return f"{self.q1.text}\n\n{self.definition}\n\n{self.relation}\n\n{self.rewritten}"


def _step(
  works: list[_Work],
  complete: Complete,
  prompt: Callable[[_Work], str],
  parse: Callable[[_Work, str], None],
) -> None:
  """One batched assistant call for the works still alive; parse() may reject."""
  alive = [w for w in works if not w.reason]
  if alive:
    for w, out in zip(alive, complete([prompt(w) for w in alive])):
      parse(w, out or "")


def _tags_and_number(w: _Work, out: str, stage: str, names: Sequence[str], number: str):
  """The named tags of one step's output and the number in tag `number`, or None after
  rejecting the work (a missing tag, a value that is not a number)."""
  tags = {n: tag(out, n) for n in names}
  if any(v is None for v in tags.values()):
    w.reject(stage, "missing tag")
    return None
  value = parse_number(tags[number])
  if value is None:
    w.reject(stage, "value is not a number")
    return None
  return tags, value


def _parse_define(w: _Work, out: str) -> None:
  got = _tags_and_number(w, out, "define", ("variable", "value", "definition"), "value")
  if got is None:
    return
  (x, definition), w.v1 = (got[0]["variable"], got[0]["definition"]), got[1]
  if w.v1 not in numbers_in(w.q1.answer):
    return w.reject("define", "value is not a number of the answer")
  if not valid_name(x) or clashes(x, w.q1.text, w.q2.text):
    return w.reject("define", "name clash")
  w.x, w.definition = x, definition


def _parse_replace(w: _Work, out: str) -> None:
  got = _tags_and_number(w, out, "replace", ("variable", "removed", "problem"), "removed")
  if got is None:
    return
  (y, rewritten), w.v2 = (got[0]["variable"], got[0]["problem"]), got[1]
  if w.v2 not in numbers_in(w.q2.text):
    return w.reject("replace", "removed constant is not in the problem")
  if not valid_name(y) or y == w.x or clashes(y, w.q1.text, w.q2.text, w.definition):
    return w.reject("replace", "name clash")
  if not clashes(y, rewritten):
    return w.reject("replace", "rewritten problem does not use the new variable")
  w.y, w.rewritten = y, rewritten


def _parse_relate(w: _Work, out: str) -> None:
  got = _tags_and_number(w, out, "relate", ("relation", "difference"), "difference")
  if got is None:
    return
  relation, d = got[0]["relation"], got[1]
  if d != w.v1 - w.v2 or not (clashes(w.x, relation) and clashes(w.y, relation)):
    return w.reject("relate", "wrong relation arithmetic")
  w.relation = relation


def _checked(stage: str, want: Callable[[_Work], Fraction], equivalent):
  def parse(w: _Work, out: str) -> None:
    value = tag(out, "value")
    if value is None:
      return w.reject(stage, "missing tag")
    if value.strip().lower() == "none" or not equivalent(value, format_number(want(w))):
      return w.reject(stage, f"{stage} recomputation differs")

  return parse


def _parse_whole(w: _Work, out: str) -> None:
  verdict = tag(out, "verdict")
  if verdict is None:
    return w.reject("v3", "missing tag")
  if verdict.strip().lower() != "yes":
    return w.reject("v3", f"v3 rejected: {tag(out, 'reason') or 'no reason given'}")


def compose(
  pairs: Sequence[tuple[Problem, Problem]],
  complete: Complete,
  equivalent: Callable[[str, str], bool] = default_equivalent,
  depth: int = 2,
) -> list[Outcome]:
  """Compose(q1, q2) for each pair: six batched assistant calls (three steps, three checks)."""
  works = [_Work(q1, q2) for q1, q2 in pairs]
  for w in works:
    if not numbers_in(w.q1.answer):
      w.reject("define", "answer has no number")
  t_def, t_rep, t_rel = _template("define"), _template("replace"), _template("relate")
  t_v1, t_v2, t_v3 = (
    _template("check_define"),
    _template("check_replace"),
    _template("check_whole"),
  )
  _step(
    works,
    complete,
    lambda w: t_def.format(
      problem=w.q1.text, answer=w.q1.answer, avoid=", ".join(symbols(w.q2.text)) or "-"
    ),
    _parse_define,
  )
  _step(works, complete, lambda w: t_rep.format(problem=w.q2.text, taken=w.x), _parse_replace)
  _step(
    works,
    complete,
    lambda w: t_rel.format(x=w.x, v1=format_number(w.v1), y=w.y, v2=format_number(w.v2)),
    _parse_relate,
  )
  _step(
    works,
    complete,
    lambda w: t_v1.format(problem=w.q1.text, definition=w.definition, x=w.x),
    _checked("v1", lambda w: w.v1, equivalent),
  )
  _step(
    works,
    complete,
    lambda w: t_v2.format(original=w.q2.text, rewritten=w.rewritten, y=w.y),
    _checked("v2", lambda w: w.v2, equivalent),
  )
  _step(
    works,
    complete,
    lambda w: t_v3.format(
      problem=w.text, x=w.x, v1=format_number(w.v1), y=w.y, v2=format_number(w.v2)
    ),
    _parse_whole,
  )
  out = []
  for w in works:
    if w.reason:
      out.append(Outcome(None, w.reason, w.stage))
      continue
    q12 = Problem(w.text, w.q2.answer, f"{w.q1.id}+{w.q2.id}", w.q2.source)
    inner_ids = w.q2.id.split("+") if "+" in w.q2.id else [w.q2.id]
    out.append(
      Outcome(
        Composed(
          q12,
          (w.q1.id, *inner_ids),
          depth,
          format_number(w.v1),
          format_number(w.v2),
          w.x,
          w.y,
          w.relation,
        ),
        "accepted",
      )
    )
  return out


def compose_chains(
  chains: Sequence[Sequence[Problem]],
  complete: Complete,
  equivalent: Callable[[str, str], bool] = default_equivalent,
) -> list[Outcome]:
  """SPC(q1..qK) = Compose(q1, SPC(q2..qK)) for chains of one length K >= 2, innermost
  first, one batched `compose` per level; the answer is gt_K."""
  if not chains:
    return []
  k = len(chains[0])
  if k < 2 or any(len(c) != k for c in chains):
    raise ValueError(
      f"compose_chains: chains must share one length >= 2, got {sorted({len(c) for c in chains})}"
    )
  inner: list[Outcome | Problem] = [c[-1] for c in chains]
  for level in range(k - 2, -1, -1):
    todo = [i for i, x in enumerate(inner) if isinstance(x, Problem) or x.composed]
    pairs = [
      (chains[i][level], inner[i] if isinstance(inner[i], Problem) else inner[i].composed.problem)
      for i in todo
    ]
    for i, outcome in zip(todo, compose(pairs, complete, equivalent, depth=k - level)):
      inner[i] = outcome
  return list(inner)


# ------------------------------------------------------------------ what to compose
def surrogate_pools(
  problems: Sequence[Problem], depth: int, pool_size: int, rng: random.Random
) -> list[list[Problem]]:
  """Positions 1..K-1 draw from small fixed pools (paper: 20), position K from all."""
  return [rng.sample(list(problems), min(pool_size, len(problems))) for _ in range(depth - 1)]


def draw_chain(
  problems: Sequence[Problem],
  pools: Sequence[Sequence[Problem]],
  rng: random.Random,
  tries: int = 100,
) -> list[Problem]:
  """One chain: pools[i] for position i+1, the full set for the last; no problem twice.
  Sequences are indexed, never copied (a plan draws 200K chains from 240K problems)."""
  for _ in range(tries):
    chain = [rng.choice(pool) for pool in pools] + [rng.choice(problems)]
    if len({p.id for p in chain}) == len(chain):
      return chain
  raise ValueError("draw_chain: could not draw distinct problems; pools are too small")


def cross_domain_pairs(
  first: Sequence[Problem], second: Sequence[Problem], n: int, rng: random.Random
) -> list[tuple[Problem, Problem]]:
  """n pairs with q1 from `first` (e.g. physics) and q2 from `second` (math): gt2 is kept."""
  return [(rng.choice(first), rng.choice(second)) for _ in range(n)]


# ------------------------------------------------------------------ the depth curriculum
@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
  """Train on depth 1, then 2, then 3 (paper: each stage from the previous one's end).

  A stage ends after `max_steps` steps in it, or earlier once the solve_all rate
  of its last `window` steps averages at least `solve_all_threshold` (the paper
  moves on when solve_all is high; 0 disables that rule).
  """

  depths: tuple[int, ...] = (1, 2, 3)
  max_steps: int = 100
  solve_all_threshold: float = 0.0
  window: int = 10

  def __post_init__(self):
    if not self.depths or any(d < 1 for d in self.depths):
      raise ValueError(f"depths: expected depths >= 1, got {self.depths}")
    if self.max_steps < 1 or self.window < 1:
      raise ValueError("max_steps and window: must be >= 1")
    if not 0.0 <= self.solve_all_threshold <= 1.0:
      raise ValueError(f"solve_all_threshold: must be in [0, 1], got {self.solve_all_threshold}")


class Curriculum:
  """Which depth to train on; `record(solve_all)` after each step; JSON-able state."""

  def __init__(self, cfg: CurriculumConfig):
    self.cfg = cfg
    self.stage, self.steps_in_stage, self.recent = 0, 0, []
    self.switches: list[int] = []  # global step counts at which a new stage began
    self.total_steps = 0

  @property
  def depth(self) -> int:
    return self.cfg.depths[self.stage]

  def record(self, solve_all: float) -> bool:
    """Counts one step of the current stage; True when the next step starts a new stage."""
    self.total_steps += 1
    self.steps_in_stage += 1
    self.recent = (self.recent + [float(solve_all)])[-self.cfg.window :]
    if self.stage + 1 >= len(self.cfg.depths):
      return False
    high = (
      self.cfg.solve_all_threshold > 0
      and len(self.recent) == self.cfg.window
      and sum(self.recent) / self.cfg.window >= self.cfg.solve_all_threshold
    )
    if self.steps_in_stage >= self.cfg.max_steps or high:
      self.stage, self.steps_in_stage, self.recent = self.stage + 1, 0, []
      self.switches.append(self.total_steps)
      return True
    return False

  def state(self) -> dict:
    return {
      "stage": self.stage,
      "steps_in_stage": self.steps_in_stage,
      "recent": self.recent,
      "switches": self.switches,
      "total_steps": self.total_steps,
    }

  def restore(self, state: dict) -> None:
    self.stage, self.steps_in_stage = int(state["stage"]), int(state["steps_in_stage"])
    self.recent = [float(x) for x in state["recent"]]
    self.switches = [int(x) for x in state["switches"]]
    self.total_steps = int(state["total_steps"])
