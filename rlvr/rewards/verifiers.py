"""One verifier per domain behind one interface: what the runner and the evaluator score with.

`open_verifier(cfg, workers)` opens the verifier of `cfg.domain` (`VERIFIERS`): "math" (final
answers against reference answers, math-verify in a `RewardPool`) or "code" (programs against
tests in the sandbox, `rlvr.rewards.code`). Every verifier gives

- `score(texts, golds) -> (rewards, correct)`, what training calls, a `Scored` whose `counts`
  say how many responses ended with each verdict (the step's `verdict_<reason>` metrics);
- `judge(texts, golds) -> (rewards, correct, notes)`, the same plus one dict per response
  that evaluation writes into its samples file (a program's verdict and reason);
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
from rlvr.rewards.config import RewardConfig
from rlvr.rewards.equivalence import is_well_formed
from rlvr.rewards.extraction import extract_answer
from rlvr.rewards.pool import RewardPool

_SHOWN = 5
_LOG = logging.getLogger(__name__)


class Scored(tuple):
  """(rewards, correct), as training unpacks it, with `counts`: verdict -> responses."""

  counts: dict

  def __new__(cls, rewards, correct, counts: dict) -> Scored:
    out = super().__new__(cls, (rewards, correct))
    out.counts = dict(counts)
    return out


def _well_formed(check: Callable[[str], bool], text: str) -> bool:
  """check(text), False where the text makes it raise (shaping must not stop a run)."""
  try:
    return bool(check(text))
  except Exception:  # noqa: BLE001 - an unreadable response states nothing
    _LOG.warning("reward: well_formed could not read a response", exc_info=True)
    return False


class Verifier(Protocol):
  def score(self, texts: Sequence[str], golds: Sequence[str]) -> tuple: ...

  def judge(self, texts: Sequence[str], golds: Sequence[str]) -> tuple: ...

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

  def judge(self, texts, golds):
    res = self.pool.score(texts, golds, self.cfg)
    return res.rewards, res.correct, [{"extracted": e} for e in res.extracted]

  def score(self, texts, golds):
    res = self.pool.score(texts, golds, self.cfg)
    return Scored(res.rewards, res.correct, {"timeout": res.timeouts, "judge_error": res.errors})

  def well_formed(self, text: str) -> bool:
    return _well_formed(
      lambda t: is_well_formed(extract_answer(t, self.cfg.extraction), self.cfg.integer_answers),
      text,
    )

  def for_eval(self) -> MathVerifier:
    return MathVerifier(dataclasses.replace(self.cfg, integer_answers=False), self.pool)

  def check_answers(self, examples, name) -> None:
    del examples, name  # every non-empty text is a reference answer (the reader checks that)


@dataclasses.dataclass
class CodeVerifier:
  """Programs (the last python block of a response) run against the problem's tests in the
  sandbox; a reference answer is the tests as JSON (`rlvr.rewards.code.formats`)."""

  cfg: RewardConfig

  def judge(self, texts, golds):
    res = code_lib.score(texts, golds, self.cfg.code)
    notes = [
      {"verdict": v.reason, "passed": v.passed, "total": v.total, "detail": v.detail}
      for v in res.verdicts
    ]
    return res.rewards, res.correct, notes

  def score(self, texts, golds):
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
        bad.append(f"row {e.index if e.index >= 0 else i}: {err}")
    if bad:
      more = f"; ... {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
      raise ValueError(
        f"{name}: {len(bad)} of {len(examples)} problems have no usable tests "
        f"(reward.domain='code' reads the reference answer as tests): "
        + "; ".join(bad[:_SHOWN])
        + more
      )


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


def open_verifier(cfg: RewardConfig, workers: int = 2) -> contextlib.AbstractContextManager:
  """The verifier of `cfg.domain`, as a context manager (`with open_verifier(cfg) as v:`)."""
  if cfg.domain not in VERIFIERS:
    raise ValueError(f"reward.domain: unknown {cfg.domain!r}; expected one of {sorted(VERIFIERS)}")
  return VERIFIERS[cfg.domain](cfg, workers)
