"""Calling the user's score functions (`rlvr.rewards.custom`) from the trainer: `Caller`.

A score function is hostile code, so it runs in the reward pool's worker processes, never in
the trainer (the task they run: `rlvr.rewards.custom_task`): each call is bounded by
`reward.fn_timeout_s` and gets its own copies of its arguments. Whatever it does wrong on
some responses (raise, hang, exit, fork, return no number) costs them their reward (0) and
gives them a verdict of `VERDICTS`, with a warning logged once per function and verdict.
When every function fails on every response of a scoring call (of at least `STOP_AT`
responses), the reward is broken, not unlucky: `RewardFunctionError` ends the run in one
line that names the function, its error and how rlvr calls it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Sequence

import numpy as np

from rlvr.rewards.custom import FIELD, RLVR, TRL, VERL, ScoreFunction, metric_names
from rlvr.rewards.custom_task import _Call, _Failed, _run_call

TIMEOUT_FIELD = "reward.fn_timeout_s"
# scored: a finite number came back; fn_raised: the call raised; fn_wrong_length: no list of
# one value per response came back; fn_not_finite: the value is NaN, infinite or not a
# number; fn_none: a TRL-form function returned None (it does not apply to the response);
# fn_timeout: the call ran past reward.fn_timeout_s; fn_died: the call ended its worker
# process (os._exit, a signal, a crash).
VERDICTS = (
  "scored",
  "fn_raised",
  "fn_wrong_length",
  "fn_not_finite",
  "fn_none",
  "fn_timeout",
  "fn_died",
)
RETRIED = ("fn_raised", "fn_wrong_length")  # a batched call's failures retried one at a time
PROBE = 2  # a verl-form function's first calls of a scoring call, before the rest
GRACE_S = 2.0  # a call's time to send its answer back, past reward.fn_timeout_s
STOP_AT = 4  # a call of at least this many responses that all fail ends the run
_CALLS = {
  RLVR: "score(responses: list[str], answers: list[str], prompts: list[str]) -> list[float]",
  VERL: "compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict "
  "with 'score', once per response",
  TRL: "reward_func(prompts=..., completions=..., ground_truth=..., solution=..., answer=...) "
  "-> list[float | None]",
}
_LOG = logging.getLogger(__name__)


class RewardFunctionError(ValueError):
  """A reward function failed on every response of a scoring call: the run stops."""


@dataclasses.dataclass
class Scores:
  """One function's scores of a call: rewards float32 [n], a verdict per response, the
  values to log (`reward_info_<key>` of verl's dict results) and the first failure's words."""

  rewards: np.ndarray
  verdicts: list[str]
  info: dict[str, list[float]]
  why: str = ""

  @property
  def failed(self) -> int:
    return sum(v not in ("scored", "fn_none") for v in self.verdicts)


class Caller:
  """Runs the user's score functions in a `RewardPool`'s workers (`rlvr.rewards.pool`),
  never in this process: each call is bounded by `timeout_s` and gets its own copies of the
  responses, answers, prompts and rows; a function that hangs, exits, forks or crashes
  costs its responses a verdict (`fn_timeout`, `fn_died`), not the run.

  A batched call (rlvr, TRL) that raises or returns the wrong number of values is retried
  one response at a time, so that one response cannot cost the others their reward; one
  that overruns its time or ends its worker costs the whole call. A verl-form function is
  called once per response: the first PROBE first, and the rest only when those did not
  all time out or die (a function that hangs on everything costs one timeout, not one per
  response)."""

  def __init__(self, fns: Sequence[ScoreFunction], pool, timeout_s: float):
    self.fns, self.pool, self.timeout_s = list(fns), pool, timeout_s
    self.metric = metric_names(self.fns)
    self._warned: set[tuple[str, str]] = set()

  def _run(self, calls: list[tuple[int, list[int], tuple]]) -> list:
    """The answers of calls (function index, responses, arguments), lost ones as _Failed."""
    if not calls:
      return []
    payloads = [(self._call(self.fns[f]), args) for f, _, args in calls]
    out = self.pool.run(_run_call, payloads, self.timeout_s + GRACE_S)
    lost = {
      self.pool.TIMED_OUT: _Failed(
        "fn_timeout", f"took longer than {TIMEOUT_FIELD}={self.timeout_s:g} s"
      ),
      self.pool.DIED: _Failed(
        "fn_died", "ended its reward worker process (an exit, a crash or a signal)"
      ),
    }
    return [lost.get(r, r) if isinstance(r, str) else r for r in out]

  @staticmethod
  def _call(sf: ScoreFunction) -> _Call:
    return _Call(sf.name, sf.form, sf.data_source, sf.conversational)

  def scores(self, texts: list, golds: list, prompts: list, rows: list) -> list[Scores]:
    """Each function's `Scores` of the responses (all functions' calls run at once)."""
    n = len(texts)
    rows = [copy.deepcopy(r) for r in rows]  # each response's own, though rows repeat
    verl = [(t, g, p, i, r) for i, (t, g, p, r) in enumerate(zip(texts, golds, prompts, rows))]
    one = [([t], [g], [p], [r]) for t, g, p, r in zip(texts, golds, prompts, rows)]
    calls = []
    for f, sf in enumerate(self.fns):
      if sf.form == VERL:
        calls += [(f, [i], verl[i]) for i in range(min(n, PROBE))]
      else:
        calls.append((f, list(range(n)), (texts, golds, prompts, rows)))
    results = self._run(calls)
    again = []
    for f, sf in enumerate(self.fns):
      mine = [r for (g, _, _), r in zip(calls, results) if g == f]
      if sf.form != VERL and n > 1 and isinstance(mine[0], _Failed) and mine[0].verdict in RETRIED:
        again += [(f, [i], one[i]) for i in range(n)]
      elif sf.form == VERL and not all(
        isinstance(r, _Failed) and r.verdict in ("fn_timeout", "fn_died") for r in mine
      ):
        again += [(f, [i], verl[i]) for i in range(PROBE, n)]
    calls, results = calls + again, results + self._run(again)
    out = [Scores(np.zeros(n, np.float32), [""] * n, {}) for _ in self.fns]
    for (f, idx, _), r in zip(calls, results):  # the retries come last: they overwrite
      s = out[f]
      if isinstance(r, _Failed):
        for i in idx:
          s.rewards[i], s.verdicts[i] = 0.0, r.verdict
        s.why = s.why or r.why
        continue
      for i, (reward, verdict, info, shown) in zip(idx, r):
        s.rewards[i], s.verdicts[i] = reward, verdict
        for key, x in info.items():
          s.info.setdefault(key, []).append(x)
        if shown:
          s.why = s.why or f"gave no finite number (response {i}: {shown})"
    for s in out:  # a verl function's responses not tried after its probe failed
      untried = [i for i, v in enumerate(s.verdicts) if not v]
      for i in untried:
        s.verdicts[i] = s.verdicts[0]
      if untried:
        s.why += f" (on its first {PROBE} responses; the other {len(untried)} were not tried)"
    return out

  def call(self, texts, golds, prompts, rows) -> tuple[np.ndarray, list[str], dict, dict]:
    """The weighted sum of the functions' rewards, each response's verdict (the first
    function's that did not score it, else "scored"), the values to log (each function's
    rewards as `reward_fn_<name>` with several functions, verl's extra keys) and, with
    several functions, each one's responses by failing verdict (`<verdict>_<name>`).

    Raises RewardFunctionError when every function failed on every response of a call of
    at least STOP_AT responses."""
    n = len(texts)
    if n == 0:
      return np.zeros(0, np.float32), [], {}, {}
    per_fn = self.scores(list(texts), list(golds), list(prompts), list(rows))
    if n >= STOP_AT and all(s.failed == n for s in per_fn):
      sf, s = self.fns[0], per_fn[0]
      others = "" if len(self.fns) == 1 else f" (and so did the other {len(self.fns) - 1})"
      raise RewardFunctionError(
        f"{FIELD}: {sf.name} failed on all {n} responses of a scoring call{others}: {s.why}; "
        f"every reward would be 0, so the run stops. rlvr calls this {sf.form}-form function "
        f"as {_CALLS[sf.form]}"
      )
    total, verdicts, info, counts = np.zeros(n, np.float32), ["scored"] * n, {}, {}
    for sf, s in zip(self.fns, per_fn):
      total += np.float32(sf.weight) * s.rewards
      verdicts = [v if v != "scored" else w for v, w in zip(verdicts, s.verdicts)]
      info.update(s.info)
      if len(self.fns) > 1:
        info[f"reward_fn_{self.metric[sf.name]}"] = s.rewards.tolist()
        for v in VERDICTS[1:]:
          counts[f"{v}_{self.metric[sf.name]}"] = s.verdicts.count(v)
      self._warn(sf, s, n)
    return total, verdicts, info, counts

  def _warn(self, sf: ScoreFunction, s: Scores, n: int) -> None:
    """Once per function and verdict: what it failed on, and why."""
    failed = [v for v in s.verdicts if v not in ("scored", "fn_none")]
    new = sorted({v for v in failed if (sf.name, v) not in self._warned})
    if not new:
      return
    self._warned.update((sf.name, v) for v in new)
    _LOG.warning(
      "%s %s failed on %d of %d responses (%s); they score 0 (verdict %s, said once per "
      "function and verdict; the metrics count every step's)",
      FIELD,
      sf.name,
      len(failed),
      n,
      s.why,
      ", ".join(new),
    )
