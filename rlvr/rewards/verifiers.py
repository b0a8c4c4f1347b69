"""One verifier per domain behind one interface: what the runner and the evaluator score with.

`open_verifier(cfg, workers)` opens the verifier of `cfg.domain` (`VERIFIERS`): "math" (final
answers against reference answers, math-verify in a `RewardPool`), "code" (programs against
tests in the sandbox, `rlvr.rewards.code`), or a user's "package.module:attribute"
(`rlvr.rewards.custom`: a score function, run by `FunctionVerifier`, or a Verifier factory).
Every verifier gives

- `score(texts, golds, prompts=None) -> (rewards, correct)`, what training calls, a `Scored`
  whose `counts` say how many responses ended with each verdict (the step's
  `verdict_<reason>` metrics); `prompts`: the problem statement of each response (the
  built-in verifiers do not read it);
- `judge(texts, golds, prompts=None) -> (rewards, correct, notes)`, the same plus one dict per
  response that evaluation writes into its samples file (a program's verdict and reason);
- `well_formed(text)`: the response states something that can be checked (QbQ's format bonus);
- `for_eval()`: the verifier held-out sets are scored with;
- `check_answers(examples, name)`: every reference answer can be scored (a code problem's tests
  parse), else a ValueError naming the bad rows.

A verifier is opened before any model is built, so a missing sandbox is an error at start-up.
Nothing a response holds raises out of `score`, `judge` or `well_formed`: a response that
cannot be judged scores 0 with its own verdict (`judge_error`; math: counted in
`verdict_judge_error`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Callable, Iterator, Protocol, Sequence

from rlvr.rewards import code as code_lib
from rlvr.rewards import custom, custom_caller
from rlvr.rewards.config import RewardConfig
from rlvr.rewards.equivalence import is_well_formed
from rlvr.rewards.extraction import extract_answer
from rlvr.rewards.pool import RewardPool

_SHOWN = 5
_LOG = logging.getLogger(__name__)


class Scored(tuple):
  """(rewards, correct), as training unpacks it, with `counts`: verdict -> responses, and
  `values`: name -> per-response values the step logs as their mean."""

  counts: dict
  values: dict

  def __new__(cls, rewards, correct, counts: dict, values: dict | None = None) -> Scored:
    out = super().__new__(cls, (rewards, correct))
    out.counts, out.values = dict(counts), dict(values or {})
    return out

  def __reduce__(self):  # pickled whole (`parallel.distributed.agreed`), not as a bare tuple
    return Scored, (self[0], self[1], self.counts, self.values)


def _states_answer(cfg: RewardConfig, text: str) -> bool:
  """The text states a well-formed final answer (`cfg.extraction`, `cfg.integer_answers`)."""
  return _well_formed(
    lambda t: is_well_formed(extract_answer(t, cfg.extraction), cfg.integer_answers), text
  )


def _well_formed(check: Callable[[str], bool], text: str) -> bool:
  """check(text), False where the text makes it raise (shaping must not stop a run)."""
  try:
    return bool(check(text))
  except Exception:  # noqa: BLE001 - an unreadable response states nothing
    _LOG.warning("reward: well_formed could not read a response", exc_info=True)
    return False


class Verifier(Protocol):
  def score(
    self, texts: Sequence[str], golds: Sequence[str], prompts: Sequence[str] | None = None
  ) -> tuple: ...

  def judge(
    self, texts: Sequence[str], golds: Sequence[str], prompts: Sequence[str] | None = None
  ) -> tuple: ...

  def well_formed(self, text: str) -> bool: ...

  def for_eval(self) -> Verifier: ...

  def check_answers(self, examples: Sequence, name: str) -> None: ...


@dataclasses.dataclass
class MathVerifier:
  """Final answers (`cfg.extraction`) against reference answers, in math-verify workers.

  Held-out sets are scored with general matching (`integer_answers` off): a reference answer
  of a MATH-500 problem is not an integer even when the training set's are."""

  cfg: RewardConfig
  pool: RewardPool

  def judge(self, texts, golds, prompts=None):
    del prompts
    res = self.pool.score(texts, golds, self.cfg)
    return res.rewards, res.correct, [{"extracted": e} for e in res.extracted]

  def score(self, texts, golds, prompts=None):
    del prompts
    res = self.pool.score(texts, golds, self.cfg)
    return Scored(res.rewards, res.correct, {"timeout": res.timeouts, "judge_error": res.errors})

  def well_formed(self, text: str) -> bool:
    return _states_answer(self.cfg, text)

  def for_eval(self) -> MathVerifier:
    return MathVerifier(dataclasses.replace(self.cfg, integer_answers=False), self.pool)

  def check_answers(self, examples, name) -> None:
    del examples, name  # every non-empty text is a reference answer (the reader checks that)


@dataclasses.dataclass
class CodeVerifier:
  """Programs (the last python block of a response) run against the problem's tests in the
  sandbox; a reference answer is the tests as JSON (`rlvr.rewards.code.formats`)."""

  cfg: RewardConfig

  def judge(self, texts, golds, prompts=None):
    del prompts
    res = code_lib.score(texts, golds, self.cfg.code)
    notes = [
      {"verdict": v.reason, "passed": v.passed, "total": v.total, "detail": v.detail}
      for v in res.verdicts
    ]
    return res.rewards, res.correct, notes

  def score(self, texts, golds, prompts=None):
    del prompts
    res = code_lib.score(texts, golds, self.cfg.code)
    return Scored(res.rewards, res.correct, {r: res.reasons.get(r, 0) for r in code_lib.REASONS})

  def well_formed(self, text: str) -> bool:
    return _well_formed(
      lambda t: code_lib.extract_program(t, self.cfg.code.extraction) is not None, text
    )

  def for_eval(self) -> CodeVerifier:
    return self

  def check_answers(self, examples, name) -> None:
    bad = []
    for i, e in enumerate(examples):
      try:
        code_lib.parse_tests(e.answer)
      except (TypeError, ValueError) as err:
        bad.append(f"{e.where() if e.index >= 0 else f'row index {i}'}: {err}")
    if bad:
      more = f"; ... {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
      raise ValueError(
        f"{name}: {len(bad)} of {len(examples)} problems have no usable tests "
        f"(reward.domain='code' reads the reference answer as tests): "
        + "; ".join(bad[:_SHOWN])
        + more
      )


@dataclasses.dataclass
class FunctionVerifier:
  """The user's score functions (`rlvr.rewards.custom`): their weighted sum, correct where > 0.

  The functions run in the reward pool's worker processes (`custom_caller.Caller`), each call
  bounded by `cfg.fn_timeout_s`, on every batch the loop scores, with the responses, their
  reference answers and their problem statements ("" where a caller gives none). Whatever
  one does wrong scores the responses concerned 0 with a verdict of `custom_caller.VERDICTS`
  (counted in `verdict_<reason>`, and per function in `verdict_<reason>_<function>` when
  there are several; evaluation notes it per response); a reward whose functions all fail
  on a whole call ends the run (`custom_caller.RewardFunctionError`). `well_formed` is the math
  domain's (a final answer in `cfg.extraction` form): what a format bonus rewards; a
  Verifier factory decides otherwise."""

  cfg: RewardConfig
  caller: custom_caller.Caller
  # problem statement -> the other columns of its data row, from the sets `check_answers`
  # saw: what TRL's keyword columns and verl's data_source / extra_info come from
  columns: dict = dataclasses.field(default_factory=dict)

  def _call(self, texts, golds, prompts):
    prompts = [""] * len(texts) if prompts is None else prompts
    rows = [self.columns.get(p, {}) for p in prompts]
    return self.caller.call(texts, golds, prompts, rows)

  def score(self, texts, golds, prompts=None):
    rewards, verdicts, info, by_fn = self._call(texts, golds, prompts)
    counts = {v: verdicts.count(v) for v in custom_caller.VERDICTS}
    return Scored(rewards, rewards > 0, {**counts, **by_fn}, info)

  def judge(self, texts, golds, prompts=None):
    rewards, verdicts, _, _ = self._call(texts, golds, prompts)
    return rewards, rewards > 0, [{"verdict": v} for v in verdicts]

  def well_formed(self, text: str) -> bool:
    return _states_answer(self.cfg, text)

  def for_eval(self) -> FunctionVerifier:
    return self

  def check_answers(self, examples, name) -> None:
    del name  # what an answer means is the function's business; its columns are kept
    self.columns.update((e.problem, e.columns) for e in examples if e.columns)


_PROTOCOL = ("score", "judge", "well_formed", "for_eval", "check_answers")


@contextlib.contextmanager
def _custom(cfg: RewardConfig, workers: int) -> Iterator[Verifier]:
  """The user's reward `cfg.domain` names: its score functions in a FunctionVerifier (run
  by `workers` reward workers that import their modules), or the Verifier its factory makes
  (entered when it is a context manager)."""
  obj = custom.score_functions(
    cfg.domain, tuple(VERIFIERS), cfg.weights, cfg.data_source, cfg.conversational
  )
  if isinstance(obj, list):
    modules = list(dict.fromkeys(sf.name.split(":", 1)[0] for sf in obj))
    with RewardPool(workers=workers, timeout_s=cfg.timeout_s, preload=modules) as pool:
      yield FunctionVerifier(cfg, custom_caller.Caller(obj, pool, cfg.fn_timeout_s))
    return
  try:
    made = obj(cfg)
  except Exception as e:  # noqa: BLE001 - the user's factory: one line at start-up
    raise ValueError(f"reward.domain: {cfg.domain!r} raised {type(e).__name__}: {e}") from e
  if not (hasattr(made, "__enter__") and hasattr(made, "__exit__")):
    made = contextlib.nullcontext(made)
  with made as verifier:
    missing = [m for m in _PROTOCOL if not callable(getattr(verifier, m, None))]
    if missing:
      raise ValueError(
        f"reward.domain: {cfg.domain!r} made a {type(verifier).__name__} without "
        f"{', '.join(missing)} (the Verifier protocol of rlvr.rewards.verifiers)"
      )
    yield verifier


@contextlib.contextmanager
def _math(cfg: RewardConfig, workers: int) -> Iterator[MathVerifier]:
  with RewardPool(workers=workers, timeout_s=cfg.timeout_s) as pool:
    yield MathVerifier(cfg, pool)


@contextlib.contextmanager
def _code(cfg: RewardConfig, workers: int) -> Iterator[CodeVerifier]:
  del workers  # the sandboxes run at once are cfg.code.workers
  code_lib.check_sandbox(cfg.code.sandbox)  # a missing sandbox stops the run here
  yield CodeVerifier(cfg)


VERIFIERS: dict[str, Callable[[RewardConfig, int], contextlib.AbstractContextManager]] = {
  "math": _math,
  "code": _code,
}


class Agreed:
  """A verifier over several processes: every process takes process 0's verdicts, through
  `agree` (`parallel.distributed.agreed`: fn -> fn returning process 0's result). Each host
  judges on its own, and a verdict that timed out under load on one host only would
  otherwise give the hosts different rewards, so different batches, and programs whose
  collectives no longer match."""

  def __init__(self, inner, agree: Callable):
    self.inner, self.agree, self._eval = inner, agree, None
    self.score, self.judge = agree(inner.score), agree(inner.judge)

  def __getattr__(self, name):  # well_formed, check_answers, ...: the verifier's own
    return getattr(self.inner, name)

  def for_eval(self) -> Agreed:
    if self._eval is None:
      inner = self.inner.for_eval()
      self._eval = self if inner is self.inner else Agreed(inner, self.agree)
    return self._eval


def open_verifier(cfg: RewardConfig, workers: int = 2) -> contextlib.AbstractContextManager:
  """The verifier of `cfg.domain`, as a context manager (`with open_verifier(cfg) as v:`): a
  built-in one, or the user's (`rlvr.rewards.custom`)."""
  if cfg.domain not in VERIFIERS:
    return _custom(cfg, workers)
  return VERIFIERS[cfg.domain](cfg, workers)
