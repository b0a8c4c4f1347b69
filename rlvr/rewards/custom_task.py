"""One call of a user's score function (`rlvr.rewards.custom`), as a reward worker makes it.

`_run_call` is the task `Caller` (`rlvr.rewards.custom_caller`) gives the reward pool: a
`_Call` loads its function by name (once per worker), calls it in its form with its own
copies of the arguments, and turns what came back into a reward and a verdict per response
(`_scored`), or one `_Failed` verdict for the whole call when it raised (SystemExit
included) or gave no list of one value per response. Nothing the function does or returns
raises out of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import numbers
import reprlib
from typing import Any, Callable, Mapping

import numpy as np

from rlvr.common import named
from rlvr.rewards.custom import FIELD, RLVR, TRL, VERL, ScoreFunction, metric_key

MAX_INFO = 16  # values logged from one verl dict result


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
