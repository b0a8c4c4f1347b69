"""Rewards of the user's own: `reward.domain = "package.module:attribute"`.

The attribute is a score function in one of three forms, told apart by its parameters, or
a Verifier factory:

- rlvr's: three positional arguments, called once per scoring call,

      def score(responses: list[str], answers: list[str], prompts: list[str]) -> list[float]

  `answers[i]` is the reference answer of response i's problem, `prompts[i]` that problem's
  statement as the data row holds it (no instruction, no chat template).
- verl's `compute_score`: its first parameters are `data_source, solution_str,
  ground_truth`; called once per response, with `extra_info` when it takes it (the data
  row's `extra_info` column, plus "prompt" and "index" where the row has none of them), and
  `data_source` = the row's `data_source` column, else `reward.data_source`. It returns a number
  or a dict whose "score" is the reward; the dict's other numeric keys are logged as
  `reward_info_<key>` (their mean over the step's responses).
- TRL's reward function: it takes `completions` (and usually `**kwargs`), called once per
  scoring call with keywords `prompts`, `completions` and the reference answer as
  `ground_truth`, `solution` and `answer` (those it accepts, all with `**kwargs`), and
  each other column of the data rows as a list (None for a response whose problem has no
  such column: a synthetic one); a row's own column of one of these names wins for its
  responses. With
  `reward.conversational` the prompts and completions are TRL's conversational form
  (lists of `{"role", "content"}` messages). It returns one float or None per completion;
  None (the function does not apply) scores 0 with verdict `fn_none`.
- a factory: a class, or a callable of one argument, called once with the run's
  `RewardConfig`; it returns a `Verifier` (the protocol of `rlvr.rewards.verifiers`), or a
  context manager that yields one.

Several score functions, comma-separated in `reward.domain`, are summed with
`reward.weights` (TRL's `reward_weights`; 1 each by default); each one's mean reward is
logged as `reward_fn_<attribute>` (`reward_fn_<module>_<attribute>` where two share an
attribute name). A response is correct (accuracy, pass@k, dynamic sampling) when its reward
is > 0.

`load` resolves and checks every name when the config is validated: a module that does not
import, or an attribute of no known form, is a one-line error naming `reward.domain`. A
score function is hostile code, so it runs in the reward pool's worker processes, never in
the trainer (`Caller`): each call is bounded by `reward.fn_timeout_s` and gets its own
copies of its arguments. Whatever it does wrong on some responses (raise, hang, exit, fork,
return no number) costs them their reward (0) and gives them a verdict of `VERDICTS`, with
a warning logged once per function and verdict. When every function fails on every
response of a scoring call (of at least `STOP_AT` responses), the reward is broken, not
unlucky: `RewardFunctionError` ends the run in one line that names the function, its error
and how rlvr calls it. A factory's Verifier is the user's own object and runs in the
trainer process.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import logging
import math
import numbers
import re
import reprlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlvr.common import named

FIELD = "reward.domain"
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
MAX_KEY = 48  # characters of a metric name taken from the user's code
MAX_INFO = 16  # values logged from one verl dict result
RLVR, VERL, TRL, FACTORY = "rlvr", "verl", "trl", "factory"
FORMS = (RLVR, VERL, TRL)  # the score functions' forms
STOP_AT = 4  # a call of at least this many responses that all fail ends the run
_CALLS = {
  RLVR: "score(responses: list[str], answers: list[str], prompts: list[str]) -> list[float]",
  VERL: "compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict "
  "with 'score', once per response",
  TRL: "reward_func(prompts=..., completions=..., ground_truth=..., solution=..., answer=...) "
  "-> list[float | None]",
}
_EXPECTED = (
  "expected score(responses, answers, prompts) -> list[float], verl's "
  "compute_score(data_source, solution_str, ground_truth, extra_info=None), TRL's "
  "reward_func(completions, **kwargs), or a factory(cfg) returning a Verifier "
  "(rlvr.rewards.custom)"
)
_LOG = logging.getLogger(__name__)


class RewardFunctionError(ValueError):
  """A reward function failed on every response of a scoring call: the run stops."""


def _binds(sig: inspect.Signature, args: int) -> bool:
  try:
    sig.bind(*[None] * args)
  except TypeError:
    return False
  return True


def form_of(sig: inspect.Signature) -> str | None:
  """The form of a function with signature `sig` (`FORMS` or FACTORY), None if none."""
  names = list(sig.parameters)
  if names[:3] == ["data_source", "solution_str", "ground_truth"]:
    return VERL
  if "completions" in sig.parameters:
    return TRL
  if _binds(sig, 3):
    return RLVR
  if _binds(sig, 1):
    return FACTORY
  return None


def load(name: str, builtins: Sequence[str]) -> tuple[Callable, str]:
  """The attribute `name` ("package.module:attribute") names and its form (`FORMS` or
  FACTORY); else a one-line ValueError naming reward.domain (`builtins`: the built-in
  domains, which the error lists for a name without a colon)."""
  obj = named.load(FIELD, name, dict.fromkeys(builtins), "a reward")
  if inspect.isclass(obj):
    return obj, FACTORY
  try:
    sig = inspect.signature(obj)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{FIELD}: {name!r}: cannot read its signature ({e}); {_EXPECTED}") from e
  form = form_of(sig)
  if form is None:
    raise ValueError(f"{FIELD}: {name!r} takes {sig}; {_EXPECTED}")
  return obj, form


@dataclasses.dataclass(frozen=True)
class ScoreFunction:
  """One of the user's score functions, as `call` runs it."""

  fn: Callable
  name: str  # "package.module:attribute"
  form: str  # one of FORMS
  weight: float = 1.0
  data_source: str = ""
  conversational: bool = False

  @property
  def short(self) -> str:
    return self.name.rsplit(":", 1)[-1]


def score_functions(
  domain: str,
  builtins: Sequence[str],
  weights: Sequence[float] = (),
  data_source: str = "",
  conversational: bool = False,
) -> list[ScoreFunction] | Callable:
  """The score functions `domain` names (comma-separated), or the one factory it names."""
  names = [n.strip() for n in domain.split(",")]
  if weights and len(weights) != len(names):
    raise ValueError(
      f"reward.weights: {len(weights)} weights for {len(names)} reward functions "
      f"({domain!r}); give one per function, or none for 1 each"
    )
  loaded = [load(n, builtins) for n in names]
  if len(loaded) == 1 and loaded[0][1] == FACTORY:
    return loaded[0][0]
  for n, (_, form) in zip(names, loaded):
    if form == FACTORY:
      raise ValueError(f"{FIELD}: {n!r} is a Verifier factory, which cannot be summed with others")
  fns = [
    ScoreFunction(fn, n, form, float(w), data_source, conversational)
    for n, (fn, form), w in zip(names, loaded, weights or [1.0] * len(names))
  ]
  metric_names(fns)  # distinct, or an error now
  return fns


def _detached(value: Any) -> Any:
  """A tensor as a host array (`.detach().cpu()`: a reward model's output with its graph, on
  an accelerator); anything else as it is."""
  if hasattr(value, "detach") and hasattr(value, "cpu"):
    return value.detach().cpu()
  return value


def _values(out: Any, n: int) -> list | None:
  """The per-response values a score function returned, or None when it is no list of them
  (a string, a mapping, a scalar, a 2-D array, an iterable that raises). At most n + 1 are
  read, so an endless generator is a wrong length, not a hang."""
  if isinstance(out, (str, bytes, Mapping)):
    return None
  try:
    out = _detached(out)
    if hasattr(out, "__array__"):  # numpy, jax, torch: one dimension of values
      arr = np.asarray(out)
      return arr.tolist() if arr.ndim == 1 else None
    return list(itertools.islice(iter(out), n + 1))
  except Exception:  # noqa: BLE001 - not iterable, its iterator raised, a hostile __array__
    return None


def _number(value: Any) -> float | None:
  """value as a finite float32-representable reward, else None (never raises)."""
  try:
    value = _detached(value)
    if hasattr(value, "__array__") and np.ndim(value) == 0:
      value = np.asarray(value).item()
    if not isinstance(value, numbers.Real):  # bools are numbers: 1.0 / 0.0
      return None
    with np.errstate(over="ignore"):
      r = float(np.float32(value))
  except Exception:  # noqa: BLE001 - a hostile value: no number
    return None
  return r if math.isfinite(r) else None


def _shown(value: Any) -> str:
  try:
    return reprlib.repr(value)
  except Exception:  # noqa: BLE001 - a hostile __repr__
    return f"a {type(value).__name__}"


def metric_key(key: Any) -> str:
  """A user's name (a verl dict key, a function's) as a metric name: letters, digits and
  single underscores, at most MAX_KEY characters ("key" where nothing is left)."""
  try:
    text = key if isinstance(key, str) else str(key)
  except Exception:  # noqa: BLE001 - a hostile __str__
    text = ""
  return re.sub(r"[^A-Za-z0-9]+", "_", text[: 4 * MAX_KEY]).strip("_")[:MAX_KEY] or "key"


def _accepts(fn: Callable, kwargs: dict) -> dict:
  """kwargs less those fn cannot take (all of them when it has **kwargs)."""
  params = inspect.signature(fn).parameters
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return kwargs
  return {k: v for k, v in kwargs.items() if k in params}


def _batch(sf: ScoreFunction, texts: list, golds: list, prompts: list, rows: list) -> Any:
  """One call of an rlvr- or TRL-form function on a batch of responses."""
  if sf.form == RLVR:
    return sf.fn(texts, golds, prompts)
  if sf.conversational:
    prompts = [[{"role": "user", "content": p}] for p in prompts]
    texts = [[{"role": "assistant", "content": t}] for t in texts]
  kwargs = dict(ground_truth=golds, solution=golds, answer=golds)
  for key in dict.fromkeys(k for row in rows for k in row):  # the rows' columns, in order
    default = kwargs.get(key, [None] * len(rows))
    kwargs[key] = [row[key] if key in row else d for row, d in zip(rows, default)]
  kwargs.update(prompts=prompts, completions=texts)
  return sf.fn(**_accepts(sf.fn, kwargs))


def _verl(sf: ScoreFunction, text: str, gold: str, prompt: str, index: int, row) -> Any:
  source = row.get("data_source")
  kwargs = dict(
    data_source=source if isinstance(source, str) else sf.data_source,
    solution_str=text,
    ground_truth=gold,
  )
  extra = row.get("extra_info")
  extra = dict(extra) if isinstance(extra, Mapping) else {}
  extra.setdefault("prompt", prompt)
  extra.setdefault("index", index)
  return sf.fn(**kwargs, **_accepts(sf.fn, dict(extra_info=extra)))


@dataclasses.dataclass(frozen=True)
class _Failed:
  """A call that gave no values: its verdict for every response it had, and why."""

  verdict: str
  why: str


def _scored(sf: ScoreFunction, value: Any) -> tuple[float, str, dict, str]:
  """One returned value as (reward, verdict, values to log, the value shown where it is no
  number)."""
  info = {}
  if sf.form == VERL and isinstance(value, Mapping):
    try:
      for k, x in itertools.islice(value.items(), MAX_INFO + 1):
        if k != "score" and _number(x) is not None and len(info) < MAX_INFO:
          info.setdefault(f"reward_info_{metric_key(k)}", _number(x))
      value = value.get("score")
    except Exception:  # noqa: BLE001 - a hostile mapping
      value = None
  if value is None and sf.form == TRL:
    return 0.0, "fn_none", info, ""
  r = _number(value)
  if r is None:
    return 0.0, "fn_not_finite", info, _shown(value)
  return r, "scored", info, ""


_LOADED: dict[str, Callable] = {}


@dataclasses.dataclass(frozen=True)
class _Call:
  """One call of a score function, as a reward worker makes it: (texts, golds, prompts,
  rows) for a batched form, (text, gold, prompt, index, row) for verl's. Its arguments are
  its own copies (pickled for it); it answers `_Failed`, or one `_scored` per response."""

  name: str
  form: str
  data_source: str
  conversational: bool

  def __call__(self, args: tuple) -> list | _Failed:
    try:
      if self.name not in _LOADED:
        _LOADED[self.name] = named.load(FIELD, self.name, {}, "a reward")
      sf = ScoreFunction(
        _LOADED[self.name], self.name, self.form, 1.0, self.data_source, self.conversational
      )
      if self.form == VERL:
        return [_scored(sf, _verl(sf, *args))]
      n = len(args[0])
      got = _batch(sf, *args)
      values = _values(got, n)
      if values is not None and len(values) == n:
        return [_scored(sf, v) for v in values]
    except BaseException as e:  # noqa: BLE001 - the user's code, SystemExit included
      return _Failed("fn_raised", f"raised {type(e).__name__}: {_said(e)}")
    if values is None:
      shown = f"a {type(got).__name__}"
    else:
      shown = f"more than {n} values" if len(values) > n else f"{len(values)} values"
    return _Failed("fn_wrong_length", f"returned {shown} for {n} responses")


def _run_call(payload: tuple) -> list | _Failed:
  """The reward pool's task: (a _Call, its arguments) -> its answer."""
  call, args = payload
  return call(args)


def _said(e: BaseException) -> str:
  """An exception's message, at most about 200 characters."""
  try:
    text = str(e)
    return text if len(text) <= 200 else text[:200] + "..."
  except Exception:  # noqa: BLE001 - a hostile __str__
    return "(its message cannot be read)"


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


def metric_names(fns: Sequence[ScoreFunction]) -> dict[str, str]:
  """Each function's metric name: its attribute, or "module_attribute" where two functions
  share an attribute name; a ValueError naming reward.domain when two are the same."""
  short = [metric_key(sf.short) for sf in fns]
  names = [
    s if short.count(s) == 1 else metric_key(sf.name.replace(":", "_")) for s, sf in zip(short, fns)
  ]
  for sf, name in zip(fns, names):
    if names.count(name) > 1:
      raise ValueError(
        f"{FIELD}: {sf.name!r} is named twice (or two names read as the metric "
        f"reward_fn_{name}); give each function once"
      )
  return {sf.name: name for sf, name in zip(fns, names)}
