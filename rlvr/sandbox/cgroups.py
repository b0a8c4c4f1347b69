"""The cgroups of a run: the number of processes, and the memory of the sandbox as a whole.

Each run gets cgroups where they are writable (`cgroup_bases`: made under this process's own
cgroup, so a container's limits still hold; cgroup v1 or v2): a pids cgroup caps the number of
processes (as root it must exist: RLIMIT_NPROC does not bind root; otherwise RLIMIT_NPROC,
which counts only the sandbox's user namespace), and a memory cgroup bounds the whole sandbox
at `memory_bound` (one process's address space + the tmpfs + `MEMORY_SLACK`), memfd, System V
shared memory, tmpfs files and the kernel memory of their inodes included, swap off. Without
a memory cgroup only each process's RLIMIT_AS holds (logged). bubblewrap 0.8 has no option for
a tmpfs's inode count (only --size): inodes are bounded through the memory cgroup (an empty
file costs about 1 KiB of it). The kernel may kill any process of the run at the memory bound,
the judge too; a run whose cgroup saw such a kill reports its failure as "memory". The host
kills everything left in the cgroups when a run ends or overruns (`RunCgroups.close`).
"""

from __future__ import annotations

import itertools
import logging
import os
import pathlib
import signal
import threading
import time

from rlvr.sandbox.limits import CodeLimits, CodeSandboxError

_LOG = logging.getLogger(__name__)
_CGROUP_PREFIX = "rlvr-code"

CONTROLLERS = ("pids", "memory")
MEMORY_SLACK = 64 << 20  # the judge's own interpreter, pipes and page tables


def memory_bound(limits: CodeLimits) -> int:
  """The memory of a whole run (every process, the /tmp tmpfs, memfd and shared memory): one
  process's address space, the tmpfs's size, and `MEMORY_SLACK` for the judge."""
  return limits.memory_bytes + limits.file_bytes + MEMORY_SLACK


def _settings(controller: str, limits: CodeLimits) -> list[tuple[tuple[str, ...], int, bool]]:
  """(files, value, required): `value` goes into the first of `files` the cgroup has (v2's
  name first, then v1's); a required one must exist and take it."""
  if controller == "pids":
    return [(("pids.max",), limits.processes + 2, True)]  # + the judge and bwrap
  mem = memory_bound(limits)
  return [
    (("memory.max", "memory.limit_in_bytes"), mem, True),
    (("memory.swap.max",), 0, False),
    (("memory.memsw.limit_in_bytes",), mem, False),  # after limit_in_bytes: never below it
  ]


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)


def _own_cgroup(controller: str) -> str | None:
  """This process's cgroup in the v1 hierarchy of `controller` ("" for the v2 one's)."""
  try:
    lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
  except OSError:
    return None
  for line in lines:
    _, names, path = line.split(":", 2)
    if controller in names.split(",") or (controller == "" and names == ""):
      return path.lstrip("/")
  return None


def _cgroup_bases(controller: str) -> list[str]:
  """Where a cgroup with `controller` may be made, best first: under this process's own cgroup
  (so the container's limits still hold), then the hierarchy's root; cgroup v1's hierarchy of
  the controller, then a v2 one with the controller in its subtree."""
  bases = []
  v1 = os.path.join("/sys/fs/cgroup", controller)
  if os.path.isfile(os.path.join(v1, "cgroup.procs")):
    own = _own_cgroup(controller)
    bases += [os.path.join(v1, own)] if own else []
    bases.append(v1)
  for v2 in [os.path.join("/sys/fs/cgroup", _own_cgroup("") or ""), "/sys/fs/cgroup"]:
    try:
      if controller in pathlib.Path(v2, "cgroup.subtree_control").read_text().split():
        bases.append(v2)
    except OSError:
      pass
  return list(dict.fromkeys(os.path.normpath(b) for b in bases))


class _Cgroup:
  """One cgroup directory of a run with its limits; `close` kills what is left in it."""

  _ids = itertools.count()

  def __init__(self, base: str, settings: list[tuple[tuple[str, ...], int, bool]]):
    self.path = os.path.join(base, f"{_CGROUP_PREFIX}-{os.getpid()}-{next(self._ids)}")
    os.mkdir(self.path)
    try:
      for files, value, required in settings:
        present = [f for f in files if os.path.exists(os.path.join(self.path, f))]
        if not present:
          if required:
            raise OSError(f"{self.path} has none of {files}")
          continue
        try:
          _write(os.path.join(self.path, present[0]), str(value))
        except OSError:
          if required:
            raise
    except OSError:
      os.rmdir(self.path)
      raise

  def number(self, files: tuple[str, ...], key: str | None = None) -> int:
    """The number in the first of `files` the cgroup has (the value of `key` in a key-value
    file), 0 where there is none."""
    for name in files:
      try:
        text = pathlib.Path(self.path, name).read_text()
      except OSError:
        continue
      for line in text.splitlines():
        k, _, value = line.rpartition(" ")
        if (k if key else "") == (key or ""):
          return int(value)
    return 0

  def close(self) -> None:
    """SIGKILLs every process still in the cgroup, then removes it."""
    deadline = time.monotonic() + 5.0
    while True:
      try:
        pids = [int(p) for p in pathlib.Path(self.path, "cgroup.procs").read_text().split()]
      except OSError:
        pids = []
      for pid in pids:
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      try:
        os.rmdir(self.path)
        return
      except OSError:
        if time.monotonic() > deadline:
          _LOG.warning("code sandbox: could not remove cgroup %s", self.path)
          return
        time.sleep(0.01)


class RunCgroups:
  """The cgroups of one run: one per hierarchy (cgroup v1 has one per controller, v2 one for
  all), made from `bases` (controller -> where), with the limits of `limits`."""

  def __init__(self, bases: dict[str, str], limits: CodeLimits):
    by_base: dict[str, list] = {}
    for controller, base in bases.items():
      by_base.setdefault(base, []).extend(_settings(controller, limits))
    self.groups: list[_Cgroup] = []
    try:
      for base, settings in by_base.items():
        self.groups.append(_Cgroup(base, settings))
    except BaseException:
      self.close()
      raise

  def wrap(self, argv: list[str]) -> list[str]:
    """argv run inside every cgroup from its first instruction on (no fork escapes a limit),
    first in line for the kernel's OOM killer (oom_score_adj 1000) rather than the host."""
    procs = [os.path.join(g.path, "cgroup.procs") for g in self.groups]
    script = (
      'echo 1000 > /proc/self/oom_score_adj; n=$1; shift; while [ "$n" -gt 0 ]; do '
      'echo $$ > "$1" || exit 126; shift; n=$((n - 1)); done; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", str(len(procs)), *procs, *argv]

  def oom_kills(self) -> int:
    """Processes the kernel killed for the memory limit."""
    return sum(g.number(("memory.events", "memory.oom_control"), "oom_kill") for g in self.groups)

  def memory_peak(self) -> int:
    """The most memory the run has held at once, in bytes (0 without a memory cgroup)."""
    return max([g.number(("memory.peak", "memory.max_usage_in_bytes")) for g in self.groups] or [0])

  def close(self) -> None:
    for g in self.groups:
      g.close()


_cgroups_lock = threading.Lock()
_cgroups: list = []  # [{controller: base}] once decided


def cgroup_bases() -> dict[str, str]:
  """Where this process makes each run's cgroups: controller -> directory, for the controllers
  of `CONTROLLERS` that are writable here (decided once).

  Raises CodeSandboxError as root without a writable pids cgroup: root is exempt from
  RLIMIT_NPROC, so nothing else would stop a fork bomb. Without a memory cgroup memory is
  bounded per process only (RLIMIT_AS), said in a logged warning.
  """
  with _cgroups_lock:
    if not _cgroups:
      _cgroups.append(_decide_cgroups())
    return _cgroups[0]


def _decide_cgroups() -> dict[str, str]:
  found = {}
  for controller in CONTROLLERS:
    for base in _cgroup_bases(controller):
      try:
        RunCgroups({controller: base}, CodeLimits()).close()
      except OSError:
        continue
      found[controller] = base
      break
  if os.geteuid() == 0 and "pids" not in found:
    raise CodeSandboxError(
      "code sandbox: cannot cap the number of processes: running as root (exempt from "
      "RLIMIT_NPROC) and no writable pids cgroup (cgroup v1 /sys/fs/cgroup/pids, or cgroup "
      "v2 /sys/fs/cgroup with the pids controller). Run as a non-root user, or give the "
      "container a writable cgroup file system."
    )
  if "memory" not in found:
    _LOG.warning(
      "code sandbox: no writable memory cgroup; a run's memory is bounded per process only "
      "(RLIMIT_AS), not for the sandbox as a whole (memfd, shared memory, many processes)"
    )
  return found


def cgroups_if_any() -> dict[str, str]:
  """The cgroups for sandbox="none": the same as bwrap's where there are some."""
  try:
    return cgroup_bases()
  except CodeSandboxError:
    return {}
