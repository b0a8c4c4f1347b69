"""A Composition-RL dataset build: composing each chain of the plan
(`rlvr.run.composition_plan`), resumable output, and the yield funnel
(docs/methods.md#composition-rl; `launch/compose.py` is its CLI).

Each chain is composed by `synthesis.composition.compose`, one Compose per level,
innermost first (SPC(q1..qK) = Compose(q1, SPC(q2..qK))), with an `Assistant` behind an
OpenAI-compatible server.

Output, append-only, one line per finished chain, flushed as it finishes:
  OUT                    accepted rows: problem, answer (gt of q_K), data_source,
                         id, source_ids, depth, v1, v2, x, y, relation (outermost
                         Compose); they load with rlvr.data.readers.read_dataset.
  OUT.rejected.jsonl     id, level, stage, reason (+ error: the server's message
                         when it refused a request, e.g. a prompt too long).
  OUT.report.json        the yield funnel over both files, per level and stage.
  OUT.plan.json          what fixes the plan (sources, depth, pool size, seed).
A rerun of the same plan skips the ids already in either file and composes the
rest; a larger n extends the same plan (the first n chains do not change).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import os
import time
from typing import Callable, Iterable, Sequence

from rlvr.run.composition_plan import Planned
from rlvr.sampling.assistant import Assistant, AssistantError

# Stages of one Compose, in the order `synthesis.composition.compose` runs them.
STAGES = ("define", "replace", "relate", "v1", "v2", "v3")


# ------------------------------------------------------------------ composing one chain
def compose_one(planned: Planned, complete: Callable[..., list[str]]) -> dict:
  """The output row of one chain: accepted (problem, answer, provenance) or rejected
  (level, stage, reason). SPC(q1..qK) = Compose(q1, SPC(q2..qK)), innermost first;
  level 1 is Compose(q_{K-1}, q_K), level K-1 the outermost. Server refusals of a
  request (too long a prompt, ...) are kept in `error`; `complete(prompts, on_error)`
  is `Assistant.complete`."""
  from synthesis import composition as comp

  chain, k = planned.chain, len(planned.chain)
  errors: list[str] = []
  call = lambda prompts: complete(prompts, errors.append)
  inner = chain[-1]
  ids = [p.id for p in chain]
  for level, pos in enumerate(range(k - 2, -1, -1), start=1):
    [outcome] = comp.compose([(chain[pos], inner)], call, depth=k - pos)
    if outcome.composed is None:
      row = {
        "id": planned.id,
        "level": level,
        "stage": outcome.stage,
        "reason": outcome.reason,
        "depth": k,
        "source_ids": ids,
      }
      if errors:
        row["error"] = errors[0]
      return row
    inner = outcome.composed.problem
  c = outcome.composed
  return {
    "id": planned.id,
    "problem": c.problem.text,
    "answer": c.problem.answer,
    "data_source": f"composed-d{c.depth}",
    "origin_source": c.problem.source,
    "depth": c.depth,
    "source_ids": list(c.ids),
    "v1": c.v1,
    "v2": c.v2,
    "x": c.x,
    "y": c.y,
    "relation": c.relation,
  }


# ------------------------------------------------------------------ files and resume
def rejected_path(out: str) -> str:
  return out + ".rejected.jsonl"


def read_rows(path: str) -> list[dict]:
  """The complete rows of a results file: newline-terminated JSON objects with an id.

  A last line without its newline (a kill mid-write) is not a row; neither is an
  undecodable line. A missing file has no rows."""
  rows = []
  try:
    f = open(path, "rb")
  except FileNotFoundError:
    return rows
  with f:
    for line in f:
      if not line.endswith(b"\n"):  # only the last line can lack it: cut short
        break
      try:
        row = json.loads(line)
      except (json.JSONDecodeError, UnicodeDecodeError):
        continue
      if isinstance(row, dict) and isinstance(row.get("id"), str):
        rows.append(row)
  return rows


def finished_ids(out: str) -> set[str]:
  """Ids finished in an earlier run: in OUT or OUT.rejected.jsonl."""
  return {r["id"] for path in (out, rejected_path(out)) for r in read_rows(path)}


def drop_partial_tail(path: str) -> int:
  """Cuts a file back to its last newline (a line cut short by a kill); bytes removed."""
  try:
    size = os.path.getsize(path)
  except FileNotFoundError:
    return 0
  with open(path, "rb+") as f:
    keep, chunk = size, 1 << 16
    while keep > 0:
      start = max(0, keep - chunk)
      f.seek(start)
      block = f.read(keep - start)
      i = block.rfind(b"\n")
      if i >= 0:
        keep = start + i + 1
        break
      keep = start
    if keep < size:
      f.truncate(keep)
  return size - keep


# ------------------------------------------------------------------ the yield report
def funnel_report(
  accepted: Iterable[dict], rejected: Iterable[dict], depth: int, planned: int
) -> dict:
  """Counts over all finished rows (each id once): how many chains entered and passed
  each stage of each level, and why the others were rejected there."""
  seen, acc, rej = set(), [], []
  for rows, into in ((accepted, acc), (rejected, rej)):
    for r in rows:
      if r["id"] not in seen:
        seen.add(r["id"])
        into.append(r)
  by_place = collections.defaultdict(collections.Counter)
  for r in rej:
    by_place[(r.get("level"), r.get("stage"))][r.get("reason", "?")] += 1
  places = [(level, stage) for level in range(1, depth) for stage in STAGES]
  places += sorted((p for p in by_place if p not in places), key=str)  # should stay empty
  entered, funnel = len(acc) + len(rej), []
  for level, stage in places:
    reasons = by_place.get((level, stage), collections.Counter())
    passed = entered - sum(reasons.values())
    funnel.append(
      {
        "level": level,
        "stage": stage,
        "entered": entered,
        "passed": passed,
        "rejected": dict(reasons.most_common()),
      }
    )
    entered = passed
  reasons = collections.Counter(f"{r.get('stage')}: {r.get('reason')}" for r in rej)
  return {
    "planned": planned,
    "finished": len(acc) + len(rej),
    "accepted": len(acc),
    "rejected": len(rej),
    "yield": round(len(acc) / max(1, len(acc) + len(rej)), 4),
    "funnel": funnel,
    "rejected_by_reason": dict(reasons.most_common()),
    "server_refused": sum(1 for r in rej if "error" in r),
  }


def format_report(report: dict) -> str:
  """The funnel as a few printable lines."""
  lines = [
    f"composed {report['finished']} of {report['planned']} planned: "
    f"{report['accepted']} accepted, {report['rejected']} rejected "
    f"(yield {report['yield']:.1%})"
  ]
  multi = any(s["level"] != 1 for s in report["funnel"])
  for s in report["funnel"]:
    where = f"L{s['level']} {s['stage']}" if multi else s["stage"]
    why = ", ".join(f"{k} {v}" for k, v in s["rejected"].items())
    lines.append(f"  {where:<11} {s['entered']:>8} -> {s['passed']:<8} {why}")
  if report["server_refused"]:
    lines.append(
      f"  ({report['server_refused']} rejections after the server refused a "
      "request; see `error` in the rejected file)"
    )
  return "\n".join(lines)


# ------------------------------------------------------------------ the run
def run(
  plan: Sequence[Planned], out: str, assistant: Assistant, concurrency: int, progress: bool = True
) -> dict:
  """Composes the planned chains not yet in the output files, appending each as it
  finishes; returns this run's counts. AssistantError propagates (rows written stay)."""
  from tqdm import tqdm

  for path in (out, rejected_path(out)):
    drop_partial_tail(path)
  done = finished_ids(out)
  todo = [p for p in plan if p.id not in done]
  counts = collections.Counter()
  if not todo:
    return counts
  assistant.check()
  bar = tqdm(
    total=len(plan),
    initial=len(plan) - len(todo),
    desc="compose",
    unit="chain",
    disable=not progress,
    dynamic_ncols=True,
  )
  pool = cf.ThreadPoolExecutor(concurrency, thread_name_prefix="compose")
  pending: set[cf.Future] = set()
  queue = iter(todo)
  ok = False
  try:
    with (
      open(out, "a", encoding="utf-8") as acc_f,
      open(rejected_path(out), "a", encoding="utf-8") as rej_f,
    ):

      def refill():
        for planned in queue:
          pending.add(pool.submit(compose_one, planned, assistant.complete))
          if len(pending) >= 2 * concurrency:
            return

      refill()
      while pending:
        finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
        for fut in finished:
          pending.discard(fut)
          row = fut.result()
          f = acc_f if "problem" in row else rej_f
          f.write(json.dumps(row, ensure_ascii=False) + "\n")
          f.flush()
          counts["accepted" if "problem" in row else "rejected"] += 1
          bar.update(1)
          bar.set_postfix(accepted=counts["accepted"], rejected=counts["rejected"], refresh=False)
        refill()
    ok = True
  finally:
    assistant.close()
    # After a failure, requests still in flight are abandoned, not awaited (the launcher
    # exits with os._exit once the report is written).
    pool.shutdown(wait=ok, cancel_futures=True)
    bar.close()
  return counts


def write_report(out: str, depth: int, planned: int, extra: dict) -> dict:
  """OUT.report.json: the funnel over both output files, plus `extra`."""
  report = funnel_report(read_rows(out), read_rows(rejected_path(out)), depth, planned)
  report.update(extra)
  with open(out + ".report.json", "w") as f:
    json.dump(report, f, indent=2)
  return report


def run_and_report(
  plan: Sequence[Planned], out: str, assistant: Assistant, concurrency: int, depth: int
) -> tuple[dict, str | None]:
  """Composes what the plan still lacks and writes OUT.report.json over all finished rows,
  with this run's time, requests and endpoint; returns (the report, the error that
  stopped the run, else None)."""
  t0, error = time.time(), None
  try:
    run(plan, out, assistant, concurrency)
  except AssistantError as e:
    error = str(e)
  except KeyboardInterrupt:
    error = "interrupted"
  report = write_report(
    out,
    depth,
    len(plan),
    {
      "this_run": {
        "seconds": round(time.time() - t0, 1),
        "requests": assistant.requests,
        "server_refused": assistant.refused,
        "endpoint": assistant.mode,
        **({"error": error} if error else {}),
      }
    },
  )
  return report, error
