"""A reward of the user's own: `reward.domain = "package.module:attribute"`.

The attribute is one of two things, told apart by what it takes:

- a score function, callable with three positional arguments:

      def score(responses: list[str], answers: list[str], prompts: list[str]) -> list[float]

  one reward per response; a response is correct (accuracy, pass@k, dynamic sampling) when
  its reward is > 0. `answers[i]` is the reference answer of response i's problem and
  `prompts[i]` that problem's statement as the data row holds it (no instruction, no chat
  template). `FunctionVerifier` (`rlvr.rewards.verifiers`) runs it.
- a factory: a class, or a callable of one argument, called once with the run's
  `RewardConfig`; it returns a `Verifier` (the protocol of `rlvr.rewards.verifiers`), or a
  context manager that yields one (entered for the run, as the built-in verifiers are).

`load` resolves and checks the attribute when the config is validated: a module that does not
import, or an attribute that is neither, is a one-line error naming `reward.domain`. `call`
treats a score function as hostile code: whatever it does wrong costs the responses concerned
their reward (0) and gives them a verdict of `VERDICTS`, with a logged warning; it never ends
the run.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import reprlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlvr.common import named

FIELD = "reward.domain"
# scored: a finite number came back; fn_raised: the call raised (every response of the call);
# fn_wrong_length: it returned no list of one value per response (every response of the call);
# fn_not_finite: this response's value is NaN, infinite or not a number.
VERDICTS = ("scored", "fn_raised", "fn_wrong_length", "fn_not_finite")
SCORE, FACTORY = "score", "factory"
_EXPECTED = (
  "expected score(responses, answers, prompts) -> list[float], or a factory(cfg) "
  "returning a Verifier (rlvr.rewards.custom)"
)
_LOG = logging.getLogger(__name__)


def _binds(sig: inspect.Signature, args: int) -> bool:
  try:
    sig.bind(*[None] * args)
  except TypeError:
    return False
  return True


def load(name: str, builtins: Sequence[str]) -> tuple[Callable, str]:
  """The attribute `name` ("package.module:attribute") names and its kind, SCORE or FACTORY;
  else a one-line ValueError naming reward.domain (`builtins`: the built-in domains, which
  the error lists for a name without a colon)."""
  obj = named.load(FIELD, name, dict.fromkeys(builtins), "a reward")
  if inspect.isclass(obj):
    return obj, FACTORY
  try:
    sig = inspect.signature(obj)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{FIELD}: {name!r}: cannot read its signature ({e}); {_EXPECTED}") from e
  if _binds(sig, 3):
    return obj, SCORE
  if _binds(sig, 1):
    return obj, FACTORY
  raise ValueError(f"{FIELD}: {name!r} takes {sig}; {_EXPECTED}")


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


def call(
  fn: Callable, name: str, texts: Sequence[str], golds: Sequence[str], prompts: Sequence[str]
) -> tuple[np.ndarray, list[str]]:
  """fn(responses, answers, prompts) as (rewards float32 [n], one verdict of VERDICTS per
  response); a response whose value is unusable scores 0. Never raises."""
  n = len(texts)
  zeros = np.zeros(n, np.float32)
  try:
    out = fn(list(texts), list(golds), list(prompts))
  except Exception as e:  # noqa: BLE001 - the user's code: its failure costs rewards, not the run
    _LOG.warning(
      "%s %s raised %s: %s; its %d responses score 0", FIELD, name, type(e).__name__, e, n
    )
    return zeros, ["fn_raised"] * n
  values = _values(out)
  if values is None or len(values) != n:
    got = f"{len(values)} values" if values is not None else f"a {type(out).__name__}"
    _LOG.warning("%s %s returned %s for %d responses; they score 0", FIELD, name, got, n)
    return zeros, ["fn_wrong_length"] * n
  rewards, verdicts = zeros, []
  for i, v in enumerate(values):
    r = _number(v)
    verdicts.append("scored" if r is not None else "fn_not_finite")
    rewards[i] = 0.0 if r is None else r
  bad = [i for i, v in enumerate(verdicts) if v != "scored"]
  if bad:
    _LOG.warning(
      "%s %s gave %d of %d responses no finite number (response %d: %s); they score 0",
      FIELD,
      name,
      len(bad),
      n,
      bad[0],
      _shown(values[bad[0]]),
    )
  return rewards, verdicts
