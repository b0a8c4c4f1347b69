"""QbQ (Question-begets-Question) synthesis and selection (docs/methods.md#qbq), pure.

One round: seeds S_t -> plan (3 of 5 operators per seed) -> one generation call per
(seed, operator) -> reject -> score each variant with k rollouts -> R_t = SelectRL ->
GRPO -> re-score R_t -> S_{t+1} = {q in R_t : n in the seed band}. This module holds
the bands, operators, prompts, parsers, the rejection rules, SelectRL and the seed
update; the teacher is called by the caller (as `complete(prompts) -> texts`) and
answer equivalence enters as `equivalent(a, b) -> bool`, so nothing of the project
is imported beyond `synthesis.composition`'s tag parser and default equivalence.

Rules the paper leaves open, and ours:
- bands use exact arithmetic on k/2: "mostly" is 2n >= k and n <= k-1, so for an
  odd k the band starts at ceil(k/2);
- the plan's invalid picks (unknown ids, repeats, picks past n) are dropped and the
  plan is filled in the fixed order O1, O2, O3, O4, O5, skipping ids already chosen;
  a reply with no <operators> tag gets the first n of that order;
- an output holding <abstain/> is an abstention even if it also holds a problem
  (the teacher said the operator does not fit; we take it at its word);
- duplicates are exact after case-folding and collapsing whitespace; a variant is a
  duplicate of an earlier accepted variant of the same call or of a `seen` statement;
- SelectRL orders by d = |n - k/2|, ties by variant id (string order); variant ids
  must be unique. Should more seeds be covered than N, the N coverage picks with the
  smallest (d, id) are kept. The selection comes back in the order it was made.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Callable, Iterable, Mapping, Sequence

from synthesis.composition import tag
from synthesis.numbers import default_equivalent

_PROMPTS = os.path.join(os.path.dirname(__file__), "prompts")
Complete = Callable[[list[str]], list[str]]


def _template(name: str) -> str:
  with open(os.path.join(_PROMPTS, f"qbq_{name}.txt")) as f:
    return f.read()


# ------------------------------------------------------------------ difficulty bands
BANDS = ("mastered", "mostly", "sometimes", "never")
SEED_BANDS = ("mostly", "sometimes", "mixed")  # the main run, and the two ablations


def _check(n: int, k: int) -> None:
  if k < 1 or not 0 <= n <= k:
    raise ValueError(f"solve count: expected 0 <= n <= k and k >= 1, got n={n}, k={k}")


def band(n: int, k: int) -> str:
  """Which of the four bands n correct of k samples falls in (every n has exactly one)."""
  _check(n, k)
  if n == k:
    return "mastered"
  if n == 0:
    return "never"
  return "mostly" if 2 * n >= k else "sometimes"


def seed_range(name: str, k: int) -> tuple[int, int]:
  """Inclusive (lo, hi) of solve counts of a band or seed band; lo > hi means empty.
  mostly (ceil(k/2), k-1), sometimes (1, ceil(k/2)-1), mixed (1, k-1) and, for
  completeness, mastered (k, k) and never (0, 0)."""
  if k < 1:
    raise ValueError(f"k: expected k >= 1, got {k}")
  half = (k + 1) // 2
  ranges = {
    "mostly": (half, k - 1),
    "sometimes": (1, half - 1),
    "mixed": (1, k - 1),
    "mastered": (k, k),
    "never": (0, 0),
  }
  if name not in ranges:
    raise ValueError(f"band: expected one of {sorted(ranges)}, got {name!r}")
  return ranges[name]


def in_band(n: int, k: int, name: str) -> bool:
  _check(n, k)
  lo, hi = seed_range(name, k)
  return lo <= n <= hi


# ------------------------------------------------------------------ operators
@dataclasses.dataclass(frozen=True)
class Operator:
  id: str
  name: str
  instruction: str
  keywords: tuple[str, ...]  # words that name it in a plan reply written without ids


OPERATORS: tuple[Operator, ...] = (
  Operator(
    "O1",
    "generalize, then specialize",
    "Pick a quantity the seed keeps fixed, treat it as a free parameter, and set it "
    "to a new concrete value where the same key fact still applies but plays out "
    "differently (for instance, more cases must be compared). Making a number "
    "bigger is not enough.",
    ("generaliz", "generalis", "speciali"),
  ),
  Operator(
    "O2",
    "parametrize and sum",
    "Turn the seed's single configuration into a small indexed family of related "
    "configurations and ask for an aggregate over the family, such as a sum. Every "
    "term must be found with the seed's key fact.",
    ("parametri", "parameteri"),
  ),
  Operator(
    "O3",
    "change the queried quantity",
    "Keep the setup, the given data and the relations of the seed, but ask for a "
    "different unknown whose computation still goes through the seed's key fact.",
    ("quer", "unknown"),
  ),
  Operator(
    "O4",
    "inverse problem",
    "Where the seed gives parameters and asks for a result, fix a value of that "
    "result instead and ask for a parameter that attains it (for instance the least "
    "one). The relation connecting them stays the same.",
    ("inverse", "reverse"),
  ),
  Operator(
    "O5",
    "add a constraint layer",
    "Place the seed's core computation inside a slightly larger problem that needs "
    "one more routine step to reduce back to the core. The extra step must not call "
    "for a new theorem.",
    ("constraint", "layer"),
  ),
)
_BY_ID = {o.id: o for o in OPERATORS}


def operator(op: str | Operator) -> Operator:
  if isinstance(op, Operator):
    return op
  if op not in _BY_ID:
    raise ValueError(f"operator: expected one of {sorted(_BY_ID)}, got {op!r}")
  return _BY_ID[op]


# ------------------------------------------------------------------ planning
def plan_prompt(seed_problem: str, n: int = 3) -> str:
  """The planning call: all five operators shown, n of them to be chosen."""
  ops = "\n".join(f"{o.id} ({o.name}): {o.instruction}" for o in OPERATORS)
  example = ", ".join(o.id for o in OPERATORS[-n:])
  return _template("plan").format(problem=seed_problem.strip(), operators=ops, n=n, example=example)


def _picks(item: str) -> list[str]:
  """The operator ids one comma-separated item names: "O2", "o 4", "O-5", "2", or a name;
  an item naming nothing we know comes back as itself (an invalid pick)."""
  item = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", "", item).strip()
  ids = [f"O{int(d)}" for d in re.findall(r"\bO\s*-?\s*(\d+)\b", item, re.IGNORECASE)]
  if ids:
    return ids
  if re.fullmatch(r"\d+", item):
    return [f"O{int(item)}"]
  words = item.lower()
  named = [o.id for o in OPERATORS if any(w in words for w in o.keywords)]
  return named if len(named) == 1 else [item]


def parse_plan(text: str, n: int = 3) -> tuple[tuple[str, ...], list[str]]:
  """The n operator ids of a planning reply, and notes on what was repaired.

  Valid picks are kept in the order given; unknown ids, repeats and picks past the
  n-th are dropped with a note; the plan is then filled from O1, O2, O3, O4, O5 in
  that order, skipping ids already chosen. Without an <operators> tag the plan is
  the first n of that order (note "missing tag")."""
  if not 1 <= n <= len(OPERATORS):
    raise ValueError(f"n: expected 1 <= n <= {len(OPERATORS)}, got {n}")
  body, notes, chosen = tag(text or "", "operators"), [], []
  if body is None:
    notes.append("missing tag")
  else:
    for item in re.split(r"[,;\n]+", body):
      for pick in _picks(item) if item.strip() else []:
        if pick not in _BY_ID:
          notes.append(f"invalid pick: {pick}")
        elif pick in chosen:
          notes.append(f"duplicate pick: {pick}")
        elif len(chosen) >= n:
          notes.append(f"extra pick: {pick}")
        else:
          chosen.append(pick)
  for o in OPERATORS:
    if len(chosen) >= n:
      break
    if o.id not in chosen:
      chosen.append(o.id)
      if body is not None:
        notes.append(f"filled: {o.id}")
  return tuple(chosen), notes


# ------------------------------------------------------------------ generation
def variant_prompt(
  seed_problem: str,
  seed_answer: str,
  op: str | Operator,
  reference_solution: str | None = None,
  integer_answer: bool = False,
) -> str:
  """One generation call: seed, its answer, a reference solution when there is one, and
  the operator's full instruction. `integer_answer` asks for an integer (AIME)."""
  o = operator(op)
  reference = (
    f"A correct solution of the seed, for reference:\n{reference_solution.strip()}"
    if reference_solution and reference_solution.strip()
    else "No reference solution is available for the seed."
  )
  rule = "\n- Its final answer is a single integer." if integer_answer else ""
  return _template("variant").format(
    problem=seed_problem.strip(),
    answer=seed_answer.strip(),
    reference=reference,
    operator_id=o.id,
    operator_name=o.name,
    instruction=o.instruction,
    answer_rule=rule,
  )


_ABSTAIN = re.compile(r"<\s*abstain\s*/?\s*>", re.IGNORECASE)
_BOXED = re.compile(r"^\$*\\boxed\{(.*)\}\$*$", re.DOTALL)


def parse_variant(text: str, integer_answer: bool = False) -> tuple[str | None, str | None, str]:
  """(problem, answer, reason) of a generation reply; reason "accepted", or "abstained",
  "missing tag", "empty problem", "empty answer" (then problem and answer are None), or
  with `integer_answer` "answer is not an integer". Only statement and answer are kept;
  an answer written as \\boxed{...} is unwrapped."""
  text = text or ""
  if _ABSTAIN.search(text):
    return None, None, "abstained"
  problem, answer = tag(text, "problem"), tag(text, "answer")
  if problem is None or answer is None:
    return None, None, "missing tag"
  boxed = _BOXED.match(answer)
  answer = boxed.group(1).strip() if boxed else answer
  if not problem:
    return None, None, "empty problem"
  if not answer:
    return None, None, "empty answer"
  if integer_answer and not re.fullmatch(r"-?\d+", answer.strip("$ ").replace(",", "")):
    return None, None, "answer is not an integer"
  return problem, answer, "accepted"


def normalise_statement(text: str) -> str:
  """The form duplicates are compared in: case-folded, whitespace collapsed."""
  return " ".join(text.split()).casefold()


def reject_variants(
  parent_answer: str,
  variants: Sequence[tuple[str, str]],
  equivalent: Callable[[str, str], bool] = default_equivalent,
  seen: Iterable[str] = (),
) -> list[str]:
  """Per (problem, answer) variant of one parent: "accepted", "same answer as parent"
  (the paper's check against copies and answer-preserving rewrites), or "duplicate"
  (same normalised statement as an earlier accepted variant here, or as a statement in
  `seen`, e.g. this round's other parents and earlier rounds)."""
  known = {normalise_statement(s) for s in seen}
  reasons = []
  for problem, answer in variants:
    key = normalise_statement(problem)
    if equivalent(answer, parent_answer):
      reasons.append("same answer as parent")
    elif key in known:
      reasons.append("duplicate")
    else:
      known.add(key)
      reasons.append("accepted")
  return reasons


# ------------------------------------------------------------------ selection
@dataclasses.dataclass(frozen=True)
class Variant:
  """A training problem with its lineage; n = correct of k rollouts (None until scored)."""

  id: str
  parent_id: str
  operator: str
  problem: str
  answer: str
  n: int | None = None


def variant_id(parent_id: str, operator_id: str) -> str:
  """Lineage in the id: a seed "aime-7" gives "aime-7/O2", whose variant gives "aime-7/O2/O5"."""
  return f"{parent_id}/{operator_id}"


def select_rl(variants: Sequence[Variant], N: int = 300, k: int = 16) -> list[Variant]:
  """SelectRL (paper Algorithm 2), |result| <= N.

  E = {1 <= n <= k-1}, d = |n - k/2|, order = (d, id). If |E| <= N, R = E. Otherwise:
  each parent seed with a variant in E gives its first variant in that order
  (coverage); cap = ceil(N / #covered seeds); the rest of E is taken in order while its
  seed holds fewer than cap picks, stopping at N; if still short, the rest of E in order
  without the cap. Then (in both cases, as in the paper's lines 18-20) if |R| < N the
  variants with n = 0, then those with n = k, are added in id order up to N.
  """
  if N < 0:
    raise ValueError(f"N: expected N >= 0, got {N}")
  ids = set()
  for v in variants:
    if v.n is None:
      raise ValueError(f"select_rl: variant {v.id!r} has no solve count")
    _check(v.n, k)
    if v.id in ids:
      raise ValueError(f"select_rl: variant id {v.id!r} appears twice")
    ids.add(v.id)

  def order(v: Variant) -> tuple[int, str]:
    return abs(2 * v.n - k), v.id  # 2d: same order as d, exact for odd k

  eligible = sorted((v for v in variants if 1 <= v.n <= k - 1), key=order)
  if len(eligible) <= N:
    chosen = list(eligible)
  else:
    best: dict[str, Variant] = {}
    for v in eligible:
      best.setdefault(v.parent_id, v)
    chosen = sorted(best.values(), key=order)[:N]
    taken = {v.id for v in chosen}
    cap = math.ceil(N / len(best))
    per_seed = {p: 1 for p in best}
    for v in eligible:
      if len(chosen) >= N:
        break
      if v.id not in taken and per_seed[v.parent_id] < cap:
        chosen.append(v)
        taken.add(v.id)
        per_seed[v.parent_id] += 1
    for v in eligible:  # cap relaxed
      if len(chosen) >= N:
        break
      if v.id not in taken:
        chosen.append(v)
        taken.add(v.id)
  for extreme in (0, k):  # degenerate top-up, last resort
    for v in sorted((v for v in variants if v.n == extreme), key=order):
      if len(chosen) >= N:
        break
      chosen.append(v)
  return chosen


def next_seeds(
  selected: Sequence[Variant], rescored_counts: Mapping[str, int], k: int, band: str = "mostly"
) -> list[Variant]:
  """S_{t+1} = {q in R_t : n_{t+1}(q) in the seed band}, carrying the new count.
  Every selected variant must have been re-scored (the paper re-scores all of R_t)."""
  out = []
  for v in selected:
    if v.id not in rescored_counts:
      raise ValueError(f"next_seeds: variant {v.id!r} was not re-scored")
    n = int(rescored_counts[v.id])
    if in_band(n, k, band):
      out.append(dataclasses.replace(v, n=n))
  return out
