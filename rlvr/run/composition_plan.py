"""The plan of a Composition-RL dataset build (`rlvr.run.composition_build`): which
problems each chain composes, and the plan file that keeps reruns to the same plan.

The plan is drawn up front from a seed: surrogate pools of `pool_size` problems
for positions 1..K-1, the last position from the whole set (from a second source
when given), n chains with ids c0..c{n-1}.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random

PLAN_KEYS = ("source", "second_source", "depth", "pool_size", "seed", "problems_sha256")


@dataclasses.dataclass(frozen=True)
class Planned:
  id: str
  chain: tuple  # of composition.Problem, q1 first


def load_problems(path: str, tag: str):
  """The rows of a dataset file as composition Problems with ids "<tag>:<row index>"."""
  from rlvr.data.readers import read_dataset
  from synthesis.composition import Problem

  return [Problem(e.problem, e.answer, f"{tag}:{e.index}", e.source) for e in read_dataset(path)]


def _tags(source: str, second: str | None) -> tuple[str, str]:
  """Short, distinct, "+"-free names of the two files for problem ids."""
  stem = lambda p: os.path.splitext(os.path.basename(p))[0].replace("+", "_").replace(":", "_")
  a = stem(source)
  b = stem(second) if second else a
  return (a, b) if b != a or not second else (a, b + "#2")


def load_sources(source: str, second_source: str | None) -> tuple[list, list | None]:
  """The problems of the source file and of the second (cross-domain) one, if any."""
  tags = _tags(source, second_source)
  first = load_problems(source, tags[0])
  return first, load_problems(second_source, tags[1]) if second_source else None


def problems_digest(*problem_sets) -> str:
  h = hashlib.sha256()
  for problems in problem_sets:
    for p in problems or ():
      h.update(json.dumps([p.id, p.text, p.answer]).encode())
  return h.hexdigest()


def make_plan(first, second, depth: int, n: int, pool_size: int, seed: int) -> list[Planned]:
  """n chains (ids c0..c{n-1}) drawn from the seed; chain i does not depend on n.

  Positions 1..K-1 must open a Compose, so only problems whose answer holds a
  number are drawn there. Same source: surrogate pools for positions 1..K-1,
  the last from all problems. Cross-domain (second given): depth 2 pairs q1
  from all of `first`, q2 from `second`; deeper chains take pools from `first`
  and the last problem from `second`.
  """
  from synthesis import composition as comp

  rng = random.Random(seed)
  openers = [p for p in first if comp.numbers_in(p.answer)]
  if not openers:
    raise ValueError(
      "no problem of the source has a number in its answer, so none can be q1 of a composition"
    )
  if second is not None and depth == 2:
    chains = comp.cross_domain_pairs(openers, list(second), n, rng)
  else:
    pools = comp.surrogate_pools(openers, depth, pool_size, rng)
    last = list(second if second is not None else first)
    chains = [comp.draw_chain(last, pools, rng) for _ in range(n)]
  return [Planned(f"c{i}", tuple(c)) for i, c in enumerate(chains)]


def prepare(
  out: str,
  first,
  second,
  *,
  source: str,
  second_source: str | None,
  depth: int,
  n: int,
  pool_size: int,
  seed: int,
) -> list[Planned]:
  """The plan of an output, checked against OUT.plan.json (written on the first run;
  ValueError when this one differs)."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  plan_info = {
    "source": os.path.abspath(source),
    "second_source": second_source and os.path.abspath(second_source),
    "depth": depth,
    "pool_size": pool_size,
    "seed": seed,
    "problems_sha256": problems_digest(first, second),
  }
  plan = make_plan(first, second, depth, n, pool_size, seed)
  check_plan_file(out + ".plan.json", plan_info)
  return plan


def check_plan_file(path: str, plan_info: dict) -> None:
  """Writes OUT.plan.json on the first run; later runs must match it (ValueError)."""
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    diff = [k for k in PLAN_KEYS if saved.get(k) != plan_info.get(k)]
    if diff:
      what = "; ".join(f"{k}: {saved.get(k)!r} then, {plan_info.get(k)!r} now" for k in diff)
      raise ValueError(
        f"{path}: this output was planned differently ({what}); rerun with the "
        "same flags or write to another --out"
      )
    return
  with open(path, "w") as f:
    json.dump(plan_info, f, indent=2)
