"""Starts the judge (`driver`) in a sandbox and reads its report: `SandboxedJudge`, `check_sandbox`.

bubblewrap gives the judge new namespaces (no network but its own loopback, its own PID space
with the judge as PID 1, its own IPC namespace for System V shared memory), no capabilities,
a root that holds read-only binds of /usr, the /bin /lib symlinks, two files of /etc and this
Python's prefix, a fresh procfs remounted read-only (bubblewrap leaves /proc/sys writable to
a caller that is root, kernel.core_pattern among it), and one writable place, a fresh tmpfs
of `file_bytes` at /tmp (the working dir). Nothing else of the host exists in there: no home,
no work dir, no host /tmp, no checkpoints or models. It dies with its parent.

As root bubblewrap runs without a user namespace and the judge drops to nobody; without the
syscall filter, or where bubblewrap cannot run as real root (found by `check_sandbox`'s
probe), it keeps a user namespace (`seccomp.judge_user`). The judge hardens itself (a fresh
session keyring, the seccomp filter: `seccomp`) ahead of any program, and each run has its
own pids and memory cgroups (`cgroups`). The host kills the whole process group (and
everything left in the cgroups) when a run ends or overruns.

`sandbox="none"` runs the same judge as a plain process with the same rlimits: for trusted
code only, said in a logged warning.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rlvr.sandbox import driver, jobs, seccomp
from rlvr.sandbox.cgroups import RunCgroups, cgroup_bases, cgroups_if_any
from rlvr.sandbox.limits import CodeLimits, CodeSandboxError

_LOG = logging.getLogger(__name__)
_STDERR_CAP = 4096  # bytes of the judge's stderr kept for error messages
_PROBE_S = 60.0  # the start-up probe's time (a loaded machine starts slowly)
_INSTALL = (
  "bubblewrap (bwrap) is not installed: apt-get install bubblewrap (Debian/Ubuntu) or "
  "dnf install bubblewrap (Fedora). Model-written code never runs unsandboxed; "
  "sandbox='none' is for trusted code only."
)


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
  binds = []
  for prefix in prefixes:  # its parents traversable by the judge's uid (under /root, say)
    parents = [str(p) for p in reversed(pathlib.PurePath(prefix).parents) if str(p) != "/"]
    binds += [a for p in parents for a in ("--perms", "0755", "--dir", p)]
    binds += ["--ro-bind", prefix, prefix]
  if seccomp.judge_user() is None:
    namespaces = ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
  else:  # real root without a user namespace; the judge keeps only what it needs to drop to nobody
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    namespaces += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
    namespaces += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  return [
    bwrap,
    *namespaces,
    "--as-pid-1",
    "--die-with-parent",
    "--new-session",
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
    "--remount-ro",
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
# One run.


def _memfd(data: bytes) -> int:
  """A close-on-exec fd holding `data`, positioned at its start (the judge's stdin)."""
  fd = os.memfd_create("rlvr-code-job", os.MFD_CLOEXEC)
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


class SandboxedJudge:
  """The judge of one job in its sandbox. Use as a context manager; `messages()` reads it.

  After `messages()` ends, `end` says how: "done", "deadline" (the overall time ran out),
  "overflow" (a report line over its cap), "bad" (a malformed line), "deep" (a line nested
  too deep to read) or "eof" (the judge ended early); `ready` says whether the judge started
  at all; `stderr` holds its tail; `oom_kills()` counts the processes the kernel killed for
  the run's memory bound, `memory_peak()` the most memory it has held.
  """

  def __init__(self, job: dict, limits: CodeLimits, sandbox: str, bwrap: str | None = None):
    self.limits = limits
    self.ready, self.end, self.stderr = False, "eof", b""
    self.proc = self._cgroups = self._tmp = None
    job = dict(job, limits=dict(job["limits"]))
    bases = cgroup_bases() if sandbox == "bwrap" else cgroups_if_any()
    if "pids" not in bases and sandbox == "bwrap":  # counts only the sandbox's user namespace
      job["limits"]["nproc"] = limits.processes + 1  # + the judge
    if sandbox == "bwrap":
      job["harden"] = seccomp.hardening()
      bwrap = bwrap or _checked.get("bwrap") or shutil.which("bwrap") or "bwrap"
      argv, cwd = bwrap_argv(bwrap, limits), "/"
    else:
      self._tmp = tempfile.TemporaryDirectory(prefix="rlvr-code-")
      argv, cwd = [_interpreter()[0], "-I", "-B", "-c", _driver_source()], self._tmp.name
    try:
      self._cgroups = RunCgroups(bases, limits)
    except BaseException:
      self._cleanup()
      raise
    argv = self._cgroups.wrap(argv)
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

  def __enter__(self) -> SandboxedJudge:
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
          except RecursionError:
            self.end = "deep"
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

  def oom_kills(self) -> int:
    """Processes of this run the kernel has killed for its memory cgroup's limit so far."""
    return self._cgroups.oom_kills() if self._cgroups is not None else 0

  def memory_peak(self) -> int:
    """The most memory this run has held at once so far (0 without a memory cgroup)."""
    return self._cgroups.memory_peak() if self._cgroups is not None else 0

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
    if self._cgroups is not None:
      self._cgroups.close()
    if self._tmp is not None:
      self._tmp.cleanup()


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
    cgroup_bases()
    try:
      _probe(path)
    except CodeSandboxError as as_root:
      if seccomp.judge_user() is None:
        raise
      seccomp.keep_user_namespace()  # bubblewrap in a user namespace, the judge as its uid 0
      try:
        _probe(path)
      except CodeSandboxError:
        seccomp.keep_user_namespace(False)
        raise as_root from None
      _LOG.warning(
        "code sandbox: bubblewrap cannot run as real root here, so the judge keeps uid 0 "
        "(the host's root, without capabilities) in a user namespace: %s",
        as_root,
      )
    if seccomp.syscall_filter() is None:
      _LOG.warning(
        "code sandbox: no system call filter on %s (it is built for x86-64); as root the "
        "judge keeps uid 0 (the host's root, without capabilities) in a user namespace",
        platform.machine(),
      )
    _checked["bwrap"] = path


def _probe(bwrap: str) -> None:
  """Runs `print("ok")` in the real sandbox; raises with bwrap's own words when it fails."""
  limits = CodeLimits(cpu_s=10, wall_s=_PROBE_S, output_bytes=1024)
  job = jobs.script("print('ok')", limits)
  with SandboxedJudge(job, limits, "bwrap", bwrap) as run:
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
