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
import, or an attribute of no known form, is a one-line error naming `reward.domain`. The
score functions are called from the trainer by `rlvr.rewards.custom_caller`, in the reward
pool's worker processes. A factory's Verifier is the user's own object and runs in the
trainer process.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Sequence

from rlvr.common import named

FIELD = "reward.domain"
MAX_KEY = 48  # characters of a metric name taken from the user's code
RLVR, VERL, TRL, FACTORY = "rlvr", "verl", "trl", "factory"
FORMS = (RLVR, VERL, TRL)  # the score functions' forms
_EXPECTED = (
  "expected score(responses, answers, prompts) -> list[float], verl's "
  "compute_score(data_source, solution_str, ground_truth, extra_info=None), TRL's "
  "reward_func(completions, **kwargs), or a factory(cfg) returning a Verifier "
  "(rlvr.rewards.custom)"
)


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


def metric_key(key: Any) -> str:
  """A user's name (a verl dict key, a function's) as a metric name: letters, digits and
  single underscores, at most MAX_KEY characters ("key" where nothing is left)."""
  try:
    text = key if isinstance(key, str) else str(key)
  except Exception:  # noqa: BLE001 - a hostile __str__
    text = ""
  return re.sub(r"[^A-Za-z0-9]+", "_", text[: 4 * MAX_KEY]).strip("_")[:MAX_KEY] or "key"


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
