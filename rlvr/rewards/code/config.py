"""Settings and results of the code reward: `CodeLimits`, `CodeRewardConfig`, `Verdict`, and
`CodeSandboxError` (the sandbox is missing or does not work here)."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

# Why a program scored what it did; every reason but "ok" scores 0 under the binary reward.
REASONS = (
  "ok",
  "wrong_answer",
  "timeout",
  "memory",
  "runtime_error",
  "output_limit",
  "no_code",
  "too_long",
  "sandbox_error",
  "judge_error",
)
SANDBOXES = ("bwrap", "none")
CODE_EXTRACTIONS = ("last_block", "whole")


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class CodeSandboxError(RuntimeError):
  """The sandbox is missing or does not work here."""


def clean_text(value, limit: int) -> str:
  """A note from the sandbox as text to log and show: a str (anything else is ""), at most
  `limit` characters, each control character or lone surrogate a space."""
  return _UNPRINTABLE.sub(" ", value[:limit]) if isinstance(value, str) else ""


def _positive(owner: str, name: str, value, kind=(int, float)) -> None:
  """Raises unless `value` is a positive finite number of the given kind (bools excluded)."""
  if (
    isinstance(value, bool)
    or not isinstance(value, kind)
    or not value > 0
    or not math.isfinite(value)
  ):
    raise ValueError(f"{owner}.{name}: expected a positive finite number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CodeLimits:
  """What one program may use, per test case unless said otherwise.

  cpu_s: CPU seconds of each process, rounded up to whole seconds (RLIMIT_CPU: SIGXCPU,
    then SIGKILL a second later).
  wall_s: wall seconds of one test case; then every process of the case is killed.
  memory_bytes: address space of each process (RLIMIT_AS).
  processes: processes (threads included) the program may have at once (a pids cgroup per
    run as root, RLIMIT_NPROC otherwise).
  output_bytes: stdout of one test case (and the size of a call's returned value).
  file_bytes: the largest file it may write (RLIMIT_FSIZE), and the size of its tmpfs.
  """

  cpu_s: float = 2.0
  wall_s: float = 4.0
  memory_bytes: int = 1 << 30
  processes: int = 16
  output_bytes: int = 1 << 20
  file_bytes: int = 16 << 20

  def __post_init__(self):
    for name in ("cpu_s", "wall_s"):
      _positive("CodeLimits", name, getattr(self, name))
    for name in ("memory_bytes", "processes", "output_bytes", "file_bytes"):
      _positive("CodeLimits", name, getattr(self, name), int)


@dataclasses.dataclass(frozen=True)
class CodeRewardConfig:
  """How responses with code become rewards.

  sandbox: "bwrap" (bubblewrap; the default and the only choice for model-written code) or
    "none" (a plain subprocess with the same rlimits: trusted code only, logged as a warning).
  limits: per-program limits (`CodeLimits`).
  workers: programs run at once (each in its own sandbox).
  pass_fraction: reward = fraction of tests passed instead of 1 when all pass, else 0.
  float_tol: 0 compares output tokens as strings; > 0 also accepts numbers within this
    absolute or relative tolerance.
  extraction: "last_block" (the last fenced python block) or "whole" (the whole response).
  max_response_chars: a longer response is not parsed (verdict "too_long").
  """

  sandbox: str = "bwrap"
  limits: CodeLimits = CodeLimits()
  workers: int = 2
  pass_fraction: bool = False
  float_tol: float = 0.0
  extraction: str = "last_block"
  max_response_chars: int = 1 << 20

  def __post_init__(self):
    if self.sandbox not in SANDBOXES:
      raise ValueError(
        f"CodeRewardConfig.sandbox: unknown {self.sandbox!r}; expected one of {SANDBOXES}"
      )
    if not isinstance(self.limits, CodeLimits):
      raise TypeError(f"CodeRewardConfig.limits: expected CodeLimits, got {self.limits!r}")
    _positive("CodeRewardConfig", "workers", self.workers, int)
    _positive("CodeRewardConfig", "max_response_chars", self.max_response_chars, int)
    if not isinstance(self.pass_fraction, bool):
      raise TypeError(f"CodeRewardConfig.pass_fraction: expected bool, got {self.pass_fraction!r}")
    if (
      isinstance(self.float_tol, bool)
      or not isinstance(self.float_tol, (int, float))
      or not 0 <= self.float_tol < 1
    ):
      raise ValueError(
        f"CodeRewardConfig.float_tol: expected a number in [0, 1), got {self.float_tol!r}"
      )
    if self.extraction not in CODE_EXTRACTIONS:
      raise ValueError(
        f"CodeRewardConfig.extraction: unknown {self.extraction!r}; "
        f"expected one of {CODE_EXTRACTIONS}"
      )


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The outcome of one program on its tests.

  passed / total: test cases passed, of all (cases not run after an early stop count as
  failed). reason: "ok" when all passed, else the first failure's (`REASONS`). detail: a
  short human-readable note on that failure.
  """

  passed: int
  total: int
  reason: str
  detail: str = ""


@dataclasses.dataclass(frozen=True)
class CodeScore:
  """Per-response results of one `score` call.

  rewards: 1.0 / 0.0 (all tests pass), or the pass fraction with `pass_fraction`.
  correct: every test passed. reasons: how many responses ended with each reason.
  """

  rewards: np.ndarray
  correct: np.ndarray
  verdicts: list
  reasons: dict
