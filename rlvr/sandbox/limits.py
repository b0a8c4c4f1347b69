"""What a sandboxed program may use (`CodeLimits`), the sandboxes there are (`SANDBOXES`) and
`CodeSandboxError` (the sandbox is missing or does not work here)."""

from __future__ import annotations

import dataclasses
import math
import re

SANDBOXES = ("bwrap", "none")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class CodeSandboxError(RuntimeError):
  """The sandbox is missing or does not work here."""


def clean_text(value, limit: int) -> str:
  """A note from the sandbox as text to log and show: a str (anything else is ""), at most
  `limit` characters, each control character or lone surrogate a space."""
  return _UNPRINTABLE.sub(" ", value[:limit]) if isinstance(value, str) else ""


def positive(owner: str, name: str, value, kind=(int, float)) -> None:
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
      positive("CodeLimits", name, getattr(self, name))
    for name in ("memory_bytes", "processes", "output_bytes", "file_bytes"):
      positive("CodeLimits", name, getattr(self, name), int)
