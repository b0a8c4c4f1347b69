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
logged as `reward_fn_<attribute>`. A response is correct (accuracy, pass@k, dynamic
sampling) when its reward is > 0.

`load` resolves and checks every name when the config is validated: a module that does not
import, or an attribute of no known form, is a one-line error naming `reward.domain`. A
score function is hostile code: whatever it does wrong on some responses costs them their
reward (0) and gives them a verdict of `VERDICTS`, with a logged warning. A function that
fails on every response of a scoring call (of at least `STOP_AT` responses) is broken, not
unlucky: `RewardFunctionError` ends the run in one line that names it, its error and how
rlvr calls it. A batched call that raises or returns the wrong length is retried one
response at a time, so that one response cannot cost the others their reward.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import numbers
import reprlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlvr.common import named

FIELD = "reward.domain"
# scored: a finite number came back; fn_raised: the call raised; fn_wrong_length: no list of
# one value per response came back; fn_not_finite: the value is NaN, infinite or not a
# number; fn_none: a TRL-form function returned None (it does not apply to the response).
VERDICTS = ("scored", "fn_raised", "fn_wrong_length", "fn_not_finite", "fn_none")
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
  return [
    ScoreFunction(fn, n, form, float(w), data_source, conversational)
    for n, (fn, form), w in zip(names, loaded, weights or [1.0] * len(names))
  ]


def _values(out: Any) -> list | None:
  """The per-response values a score function returned, or None when it is no list of them
  (a string, a mapping, a scalar, a 2-D array, an iterable that raises)."""
  if isinstance(out, (str, bytes, Mapping)):
    return None
  if hasattr(out, "__array__"):  # numpy, jax, torch: one dimension of values
    try:
      arr = np.asarray(out)
    except Exception:  # noqa: BLE001 - hostile return value
      return None
    return arr.tolist() if arr.ndim == 1 else None
  try:
    return list(out)
  except Exception:  # noqa: BLE001 - not iterable, or its iterator raised
    return None


def _number(value: Any) -> float | None:
  """value as a finite float32-representable reward, else None."""
  if hasattr(value, "__array__") and np.ndim(value) == 0:
    value = np.asarray(value).item()
  if not isinstance(value, numbers.Real):  # bools are numbers: 1.0 / 0.0
    return None
  try:
    r = float(np.float32(value))
  except (OverflowError, ValueError, TypeError):
    return None
  return r if math.isfinite(r) else None


def _shown(value: Any) -> str:
  try:
    return reprlib.repr(value)
  except Exception:  # noqa: BLE001 - a hostile __repr__
    return f"a {type(value).__name__}"


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


@dataclasses.dataclass
class _Outcome:
  values: list  # per response: the raw value, or None where it failed
  verdicts: list
  why: str = ""  # the first failure, for the warning and the error


def _raw(sf: ScoreFunction, texts: list, golds: list, prompts: list, rows: list) -> _Outcome:
  """Each response's raw value, or its failure verdict."""
  n = len(texts)
  if sf.form == VERL:
    out = _Outcome([None] * n, ["scored"] * n)
    for i, (t, g, p, row) in enumerate(zip(texts, golds, prompts, rows)):
      try:
        out.values[i] = _verl(sf, t, g, p, i, row)
      except Exception as e:  # noqa: BLE001 - the user's code: it costs this response
        out.verdicts[i] = "fn_raised"
        out.why = out.why or f"raised {type(e).__name__}: {e}"
    return out
  try:
    got = _batch(sf, texts, golds, prompts, rows)
  except Exception as e:  # noqa: BLE001 - the user's code
    why, verdict = f"raised {type(e).__name__}: {e}", "fn_raised"
  else:
    values = _values(got)
    if values is not None and len(values) == n:
      return _Outcome(values, ["scored"] * n)
    shown = f"{len(values)} values" if values is not None else f"a {type(got).__name__}"
    why, verdict = f"returned {shown} for {n} responses", "fn_wrong_length"
  if n == 1:
    return _Outcome([None], [verdict], why)
  # one response at a time: which of them the function cannot score
  parts = [_raw(sf, [t], [g], [p], [r]) for t, g, p, r in zip(texts, golds, prompts, rows)]
  return _Outcome([o.values[0] for o in parts], [o.verdicts[0] for o in parts], why)


@dataclasses.dataclass
class Scores:
  """One function's scores of a call: rewards float32 [n], a verdict per response, and
  the means to log (`reward_info_<key>` of verl's dict results)."""

  rewards: np.ndarray
  verdicts: list[str]
  info: dict[str, list[float]]


def call(
  sf: ScoreFunction,
  texts: Sequence[str],
  golds: Sequence[str],
  prompts: Sequence[str],
  rows: Sequence[Mapping] | None = None,
):
  """`sf` on the responses as `Scores`; `rows[i]`: the other columns of response i's data
  row ({} for none). A response whose value is unusable scores 0 with a warning. Raises
  RewardFunctionError when every response of a call of at least STOP_AT fails."""
  n = len(texts)
  rows = [{}] * n if rows is None else list(rows)
  out = _raw(sf, list(texts), list(golds), list(prompts), rows)
  rewards, info = np.zeros(n, np.float32), {}
  for i, v in enumerate(out.values):
    if out.verdicts[i] != "scored":
      continue
    if sf.form == VERL and isinstance(v, Mapping):
      for k, x in v.items():
        if k != "score" and _number(x) is not None:
          info.setdefault(f"reward_info_{k}", []).append(_number(x))
      v = v.get("score")
    if v is None and sf.form == TRL:
      out.verdicts[i] = "fn_none"
      continue
    r = _number(v)
    if r is None:
      out.verdicts[i] = "fn_not_finite"
      out.why = out.why or f"gave no finite number (response {i}: {_shown(v)})"
    rewards[i] = 0.0 if r is None else r
  failed = [v for v in out.verdicts if v not in ("scored", "fn_none")]
  if failed and len(failed) == n >= STOP_AT:
    raise RewardFunctionError(
      f"{FIELD}: {sf.name} failed on all {n} responses of a scoring call: {out.why}; every "
      f"reward would be 0, so the run stops. rlvr calls this {sf.form}-form function as "
      f"{_CALLS[sf.form]}"
    )
  if failed:
    _LOG.warning(
      "%s %s failed on %d of %d responses (%s); they score 0",
      FIELD,
      sf.name,
      len(failed),
      n,
      out.why,
    )
  return Scores(rewards, out.verdicts, info)


def call_all(
  fns: Sequence[ScoreFunction],
  texts: Sequence[str],
  golds: Sequence[str],
  prompts: Sequence[str],
  rows: Sequence[Mapping] | None = None,
) -> tuple[np.ndarray, list[str], dict[str, list[float]]]:
  """The weighted sum of the functions' rewards, each response's verdict (the first
  function's that did not score it, else "scored") and the values to log: each function's
  rewards (`reward_fn_<attribute>`, with several functions) and verl's extra keys."""
  total, verdicts, info = np.zeros(len(texts), np.float32), ["scored"] * len(texts), {}
  for sf in fns:
    s = call(sf, texts, golds, prompts, rows)
    total += np.float32(sf.weight) * s.rewards
    verdicts = [v if v != "scored" else w for v, w in zip(verdicts, s.verdicts)]
    info.update(s.info)
    if len(fns) > 1:
      info[f"reward_fn_{sf.short}"] = s.rewards.tolist()
  return total, verdicts, info
