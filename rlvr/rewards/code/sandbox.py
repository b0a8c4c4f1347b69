"""Starts the judge (`driver`) in a sandbox and reads its report: `Run`, `check_sandbox`.

bubblewrap gives the judge new namespaces (`--unshare-all`: no network but its own loopback,
its own PID space with the judge as PID 1, no user namespaces inside), no capabilities, a
root that holds read-only binds of /usr, the /bin /lib symlinks, two files of /etc and this
Python's prefix, and one writable place, a fresh tmpfs of `file_bytes` at /tmp (the working
dir). Nothing else of the host exists in there: no home, no work dir, no host /tmp, no
checkpoints or models. It dies with its parent. As root the number of processes is capped by
a pids cgroup per run (RLIMIT_NPROC does not bind root); otherwise by RLIMIT_NPROC, which
inside bubblewrap's user namespace counts only the sandbox's processes. The host kills the
whole process group (and everything left in the cgroup) when a run ends or overruns.

`sandbox="none"` runs the same judge as a plain process with the same rlimits: for trusted
code only, said in a logged warning.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import pathlib
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rlvr.rewards.code import driver
from rlvr.rewards.code.config import CodeLimits
from rlvr.rewards.code.formats import TestSpec

_LOG = logging.getLogger(__name__)
_STDERR_CAP = 4096  # bytes of the judge's stderr kept for error messages
_PROBE_S = 60.0  # the start-up probe's time (a loaded machine starts slowly)
_CGROUP_PREFIX = "rlvr-code"
_INSTALL = (
  "bubblewrap (bwrap) is not installed: apt-get install bubblewrap (Debian/Ubuntu) or "
  "dnf install bubblewrap (Fedora). Model-written code never runs unsandboxed; "
  "sandbox='none' is for trusted code only."
)


class CodeSandboxError(RuntimeError):
  """The sandbox is missing or does not work here."""


@functools.cache
def _driver_source() -> str:
  return pathlib.Path(driver.__file__).read_text()


def _interpreter() -> tuple[str, list[str]]:
  """The Python to run inside (this one's base interpreter) and the prefix to bind for it."""
  prefix = os.path.realpath(sys.base_prefix)
  exe = os.path.realpath(sys.executable)
  if not exe.startswith((prefix + os.sep, "/usr/")):  # a venv made with --copies
    exe = os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
  if not os.access(exe, os.X_OK):
    raise CodeSandboxError(f"no Python interpreter to run in the sandbox (tried {exe})")
  return exe, [] if prefix == "/usr" or prefix.startswith("/usr/") else [prefix]


def _system_binds() -> list[str]:
  """Read-only /usr, the top-level /bin /lib ... (as symlinks where the host has symlinks)."""
  args = []
  for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  for path in ("/etc/ld.so.cache", "/etc/localtime"):
    args += ["--ro-bind-try", path, path]
  return args


def bwrap_argv(bwrap: str, limits: CodeLimits) -> list[str]:
  """The bubblewrap command line that runs the judge."""
  exe, prefixes = _interpreter()
  binds = [a for p in prefixes for a in ("--ro-bind", p, p)]
  return [
    bwrap,
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--as-pid-1",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/bin:/bin",
    "--setenv",
    "HOME",
    "/tmp",
    "--setenv",
    "LANG",
    "C.UTF-8",
    *_system_binds(),
    *binds,
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--perms",
    "1777",
    "--size",
    str(limits.file_bytes),
    "--tmpfs",
    "/tmp",
    "--remount-ro",
    "/dev",
    "--remount-ro",
    "/",
    "--chdir",
    "/tmp",
    "--",
    exe,
    "-I",
    "-B",
    "-c",
    _driver_source(),
  ]


# ---------------------------------------------------------------------------
# The process cap.


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)


def _cgroup_bases() -> list[str]:
  """Where a pids cgroup may be made: cgroup v1's pids hierarchy, or a v2 root with pids."""
  bases = []
  if os.path.isfile("/sys/fs/cgroup/pids/cgroup.procs"):
    bases.append("/sys/fs/cgroup/pids")
  try:
    if "pids" in pathlib.Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split():
      bases.append("/sys/fs/cgroup")
  except OSError:
    pass
  return bases


class _PidsCgroup:
  """A pids cgroup of one run: at most `max_pids` processes; kills what is left at the end."""

  _ids = itertools.count()

  def __init__(self, base: str, max_pids: int):
    self.path = os.path.join(base, f"{_CGROUP_PREFIX}-{os.getpid()}-{next(self._ids)}")
    os.mkdir(self.path)
    try:
      _write(os.path.join(self.path, "pids.max"), str(max_pids))
    except OSError:
      os.rmdir(self.path)
      raise

  def wrap(self, argv: list[str]) -> list[str]:
    """argv run inside the cgroup from its first instruction on (no fork escapes the cap)."""
    procs = os.path.join(self.path, "cgroup.procs")
    return ["/bin/sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", procs, *argv]

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


_cap_lock = threading.Lock()
_cap: list = []  # [("cgroup", base) | ("rlimit", None)] once decided


def process_cap() -> tuple[str, str | None]:
  """How the number of processes is capped here: ("cgroup", base) as root, else ("rlimit", None).

  Raises CodeSandboxError as root without a writable pids cgroup: root is exempt from
  RLIMIT_NPROC, so nothing else would stop a fork bomb.
  """
  with _cap_lock:
    if not _cap:
      _cap.append(_decide_cap())
    return _cap[0]


def _decide_cap() -> tuple[str, str | None]:
  if os.geteuid() != 0:
    return "rlimit", None
  for base in _cgroup_bases():
    try:
      _PidsCgroup(base, 1).close()
      return "cgroup", base
    except OSError:
      continue
  raise CodeSandboxError(
    "code sandbox: cannot cap the number of processes: running as root (exempt from "
    "RLIMIT_NPROC) and no writable pids cgroup (cgroup v1 /sys/fs/cgroup/pids, or cgroup v2 "
    "/sys/fs/cgroup with the pids controller). Run as a non-root user, or give the "
    "container a writable cgroup file system."
  )


# ---------------------------------------------------------------------------
# One run.


def _memfd(data: bytes) -> int:
  """A close-on-exec fd holding `data`, positioned at its start (the judge's stdin)."""
  fd = os.memfd_create("rlvr-code-job", os.MFD_CLOEXEC)
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


class Run:
  """The judge of one job in its sandbox. Use as a context manager; `messages()` reads it.

  After `messages()` ends, `end` says how: "done", "deadline" (the overall time ran out),
  "overflow" (a report line over its cap), "bad" (a malformed line) or "eof" (the judge
  ended early); `ready` says whether the judge started at all; `stderr` holds its tail.
  """

  def __init__(self, job: dict, limits: CodeLimits, sandbox: str, bwrap: str | None = None):
    self.limits = limits
    self.ready, self.end, self.stderr = False, "eof", b""
    self.proc = self._cgroup = self._tmp = None
    job = dict(job, limits=dict(job["limits"]))
    mode, base = process_cap() if sandbox == "bwrap" else _cap_if_any()
    if mode == "rlimit" and sandbox == "bwrap":  # counts only the sandbox's user namespace
      job["limits"]["nproc"] = limits.processes + 1  # + the judge
    if sandbox == "bwrap":
      bwrap = bwrap or _checked.get("bwrap") or shutil.which("bwrap") or "bwrap"
      argv, cwd = bwrap_argv(bwrap, limits), "/"
    else:
      self._tmp = tempfile.TemporaryDirectory(prefix="rlvr-code-")
      argv, cwd = [_interpreter()[0], "-I", "-B", "-c", _driver_source()], self._tmp.name
    if mode == "cgroup":
      self._cgroup = _PidsCgroup(base, limits.processes + 2)  # + the judge and bwrap
      argv = self._cgroup.wrap(argv)
    stdin = _memfd(json.dumps(job).encode())
    try:
      self.proc = subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd},
        start_new_session=True,
      )
    except BaseException:
      self._cleanup()
      raise
    finally:
      os.close(stdin)

  def __enter__(self) -> Run:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def messages(self, deadline: float):
    """Yields the judge's case messages until it is done, fails, or `deadline` passes."""
    out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
    line_cap = 8 * self.limits.output_bytes + (1 << 16)
    buf = bytearray()
    with selectors.DefaultSelector() as sel:
      sel.register(out, selectors.EVENT_READ)
      sel.register(err, selectors.EVENT_READ)
      while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
          self.end = "deadline"
          return
        for key, _ in sel.select(left):
          data = os.read(key.fd, 1 << 16)
          if not data:
            sel.unregister(key.fd)
          elif key.fd == err:
            self.stderr = (self.stderr + data)[-_STDERR_CAP:]
          else:
            buf += data
        while (nl := buf.find(b"\n")) >= 0:
          line, buf = bytes(buf[:nl]), buf[nl + 1 :]
          try:
            msg = json.loads(line)
          except ValueError:
            self.end = "bad"
            return
          if not isinstance(msg, dict):
            self.end = "bad"
            return
          if msg.get("ready"):
            self.ready = True
          elif msg.get("done"):
            self.end = "done"
            return
          else:
            yield msg
        if len(buf) > line_cap:
          self.end = "overflow"
          return

  def close(self) -> None:
    """Ends the run: waits briefly for a finished judge, else kills its process group."""
    if self.end == "done":
      try:
        self.proc.wait(timeout=2.0)
      except subprocess.TimeoutExpired:
        pass
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.proc.wait()
    self._cleanup()

  def _cleanup(self) -> None:
    if self.proc is not None:
      self.proc.stdout.close()
      self.proc.stderr.close()
    if self._cgroup is not None:
      self._cgroup.close()
    if self._tmp is not None:
      self._tmp.cleanup()


def _cap_if_any() -> tuple[str | None, str | None]:
  """The process cap for sandbox="none": the same as bwrap's where there is one."""
  try:
    return process_cap()
  except CodeSandboxError:
    return None, None


# ---------------------------------------------------------------------------
# Start-up check.

_check_lock = threading.Lock()
_checked: dict[str, str] = {}  # "bwrap" -> its path, once a probe has passed
_warned: list = []


def check_sandbox(sandbox: str = "bwrap") -> None:
  """Raises CodeSandboxError unless `sandbox` works here (cached after the first success).

  "bwrap": bubblewrap is installed, the process cap is available, and a probe program runs
  in the real sandbox. "none": logs (once) that code will run unsandboxed.
  """
  if sandbox == "none":
    if not _warned:
      _warned.append(True)
      _LOG.warning(
        "code sandbox 'none': programs run as plain processes with rlimits only, "
        "seeing this machine's files and network. For trusted code only."
      )
    return
  if sandbox != "bwrap":
    raise ValueError(f"sandbox: unknown {sandbox!r}; expected 'bwrap' or 'none'")
  with _check_lock:
    if "bwrap" in _checked:
      return
    path = shutil.which("bwrap")
    if path is None:
      raise CodeSandboxError(_INSTALL)
    process_cap()
    _probe(path)
    _checked["bwrap"] = path


def _probe(bwrap: str) -> None:
  """Runs `print("ok")` in the real sandbox; raises with bwrap's own words when it fails."""
  limits = CodeLimits(cpu_s=10, wall_s=_PROBE_S, output_bytes=1024)
  job = TestSpec("stdio", ("",), ("ok",)).job("print('ok')", limits)
  with Run(job, limits, "bwrap", bwrap) as run:
    msgs = list(run.messages(time.monotonic() + _PROBE_S))
  if run.end != "done" or not msgs or msgs[0].get("stdout") != "ok\n":
    why = run.stderr.decode("utf-8", "replace").strip() or f"no result ({run.end})"
    raise CodeSandboxError(
      f"bubblewrap (bwrap) is installed at {bwrap} but does not work here: {why}"
    )


def sandbox_available() -> bool:
  """Whether the bubblewrap sandbox works here (see `check_sandbox` for why not)."""
  try:
    check_sandbox("bwrap")
  except CodeSandboxError:
    return False
  return True
