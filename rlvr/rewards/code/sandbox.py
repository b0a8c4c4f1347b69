"""Starts the judge (`driver`) in a sandbox and reads its report: `Run`, `check_sandbox`.

bubblewrap gives the judge new namespaces (no network but its own loopback, its own PID space
with the judge as PID 1, its own IPC namespace for System V shared memory), no capabilities,
a root that holds read-only binds of /usr, the /bin /lib symlinks, two files of /etc and this
Python's prefix, a fresh procfs remounted read-only (bubblewrap leaves /proc/sys writable to
a caller that is root, kernel.core_pattern among it), and one writable place, a fresh tmpfs
of `file_bytes` at /tmp (the working dir). Nothing else of the host exists in there: no home,
no work dir, no host /tmp, no checkpoints or models. It dies with its parent.

The judge's uid. A root host cannot give bubblewrap a user namespace whose uid 0 is someone
else (bubblewrap maps the sandbox's one uid to the caller's, and run as nobody it cannot bind
an interpreter under a root-only directory such as /root/.pyenv). So as root bubblewrap runs
without a user namespace, keeping only CAP_SETUID and CAP_SETGID, and the judge drops to
uid and gid 65534 (`NOBODY`) before it reads a program: every file of the host the sandbox
can reach is then the host's nobody's to touch. That needs the syscall filter (below) to
refuse new user namespaces (bubblewrap's --disable-userns needs a user namespace of its own),
so without the filter (not x86-64), or where bubblewrap cannot run as real root (a container
without CAP_SYS_ADMIN: `check_sandbox`'s probe finds it), a root host keeps the user
namespace whose uid 0 is the host's root, without capabilities (logged). A non-root host runs bubblewrap in a user
namespace as itself (--disable-userns).

Before any program runs the judge also joins a fresh anonymous session keyring (the host's
session keyring, and the keys in it, are not the sandbox's) and then installs a seccomp
filter, built here as classic BPF for x86-64 (`syscall_filter`): it refuses keyctl, add_key,
request_key, ptrace, process_vm_*, the mount and namespace calls (clone with a namespace flag
included), bpf, perf_event_open, userfaultfd, io_uring, modules, kexec, reboot, swap and a
few more (`BLOCKED_SYSCALLS`), and kills a process that enters through the i386 or x32 ABI.
On other machines there is no filter (a logged warning), and the other bounds stay.

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
kills the whole process group (and everything left in the cgroups) when a run ends or
overruns.

`sandbox="none"` runs the same judge as a plain process with the same rlimits: for trusted
code only, said in a logged warning.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import logging
import os
import pathlib
import platform
import selectors
import shutil
import signal
import struct
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
  binds = []
  for prefix in prefixes:  # its parents traversable by the judge's uid (under /root, say)
    parents = [str(p) for p in reversed(pathlib.PurePath(prefix).parents) if str(p) != "/"]
    binds += [a for p in parents for a in ("--perms", "0755", "--dir", p)]
    binds += ["--ro-bind", prefix, prefix]
  if judge_user() is None:
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
# What the judge does to itself before any program runs: `hardening`.

NOBODY = 65534  # the judge's uid and gid when the host runs as root
# keyctl's system call number (the judge joins a fresh session keyring with it).
_KEYCTL_NR = {"x86_64": 250, "aarch64": 219}
# System calls the judge and the programs never need, refused with EPERM (x86-64 numbers):
# keys, tracing other processes, mounts, new namespaces, and kernel interfaces with a
# history of exploits (BPF, perf, userfaultfd, io_uring), modules, kexec, reboot, swap.
BLOCKED_SYSCALLS = {
  "ptrace": 101,
  "process_vm_readv": 310,
  "process_vm_writev": 311,
  "keyctl": 250,
  "add_key": 248,
  "request_key": 249,
  "mount": 165,
  "umount2": 166,
  "pivot_root": 155,
  "chroot": 161,
  "open_tree": 428,
  "move_mount": 429,
  "fsopen": 430,
  "fsconfig": 431,
  "fsmount": 432,
  "fspick": 433,
  "mount_setattr": 442,
  "unshare": 272,
  "setns": 308,
  "bpf": 321,
  "perf_event_open": 298,
  "userfaultfd": 323,
  "io_uring_setup": 425,
  "io_uring_enter": 426,
  "io_uring_register": 427,
  "name_to_handle_at": 303,
  "open_by_handle_at": 304,
  "kexec_load": 246,
  "kexec_file_load": 320,
  "init_module": 175,
  "finit_module": 313,
  "delete_module": 176,
  "reboot": 169,
  "swapon": 167,
  "swapoff": 168,
  "acct": 163,
  "quotactl": 179,
  "iopl": 172,
  "ioperm": 173,
}
_CLONE, _CLONE3 = 56, 435
_CLONE_NAMESPACES = (
  0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
)
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
# Classic BPF opcodes and seccomp return values.
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


@functools.cache
def syscall_filter() -> bytes | None:
  """The judge's seccomp filter, a classic BPF program (struct sock_filter[]), or None when
  this machine is not x86-64 (the system call numbers above are x86-64's).

  Kills a process that enters through another ABI (i386's `int 0x80`, x32); refuses the
  `BLOCKED_SYSCALLS`, and clone() with a namespace flag, with EPERM; clone3() with ENOSYS (its
  flags sit in memory a filter cannot read; glibc then falls back to clone()).
  """
  if platform.machine() != "x86_64":
    return None
  code: list[tuple[int, int, str | None, str | None]] = [
    (_LD_ABS, 4, None, None),  # seccomp_data.arch
    (_JEQ, _AUDIT_ARCH_X86_64, None, "kill"),
    (_LD_ABS, 0, None, None),  # seccomp_data.nr
    (_JGE, _X32_SYSCALL_BIT, "kill", None),
  ]
  code += [(_JEQ, nr, "eperm", None) for nr in sorted(BLOCKED_SYSCALLS.values())]
  code += [
    (_JEQ, _CLONE3, "enosys", None),
    (_JEQ, _CLONE, None, "allow"),
    (_LD_ABS, 16, None, None),  # the low half of seccomp_data.args[0]: clone's flags
    (_JSET, _CLONE_NAMESPACES, "eperm", "allow"),
  ]
  returns = {
    "allow": _ALLOW,
    "eperm": _RET_ERRNO | errno.EPERM,
    "enosys": _RET_ERRNO | errno.ENOSYS,
    "kill": _KILL_PROCESS,
  }
  at = {label: len(code) + i for i, label in enumerate(returns)}
  out = []
  for i, (op, k, jt, jf) in enumerate(code):
    jump = [0 if t is None else at[t] - i - 1 for t in (jt, jf)]
    out.append(struct.pack("=HBBI", op, jump[0], jump[1], k))
  out += [struct.pack("=HBBI", _RET, 0, 0, k) for k in returns.values()]
  return b"".join(out)


_judge_uid: list = []  # [uid or None] where the start-up probe decided otherwise


def judge_user() -> int | None:
  """The uid (and gid) the judge drops to: `NOBODY` when the host runs as root and the syscall
  filter exists here (it is what refuses new user namespaces there), else None; None too
  where bubblewrap cannot run as real root (no CAP_SYS_ADMIN), found by `check_sandbox`."""
  if _judge_uid:
    return _judge_uid[0]
  return NOBODY if os.geteuid() == 0 and syscall_filter() is not None else None


def hardening() -> dict:
  """What the sandboxed judge does first (`driver._harden`): join a fresh session keyring
  (`keyctl`: the system call number), drop to `uid`, install the `seccomp` filter (hex)."""
  bpf = syscall_filter()
  return {
    "keyctl": _KEYCTL_NR.get(platform.machine()),
    "uid": judge_user(),
    "seccomp": None if bpf is None else bpf.hex(),
  }


# ---------------------------------------------------------------------------
# The cgroups of a run: the number of processes, and the memory of the sandbox as a whole.

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


class _RunCgroups:
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
        _RunCgroups({controller: base}, CodeLimits()).close()
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
    bases = cgroup_bases() if sandbox == "bwrap" else _cgroups_if_any()
    if "pids" not in bases and sandbox == "bwrap":  # counts only the sandbox's user namespace
      job["limits"]["nproc"] = limits.processes + 1  # + the judge
    if sandbox == "bwrap":
      job["harden"] = hardening()
      bwrap = bwrap or _checked.get("bwrap") or shutil.which("bwrap") or "bwrap"
      argv, cwd = bwrap_argv(bwrap, limits), "/"
    else:
      self._tmp = tempfile.TemporaryDirectory(prefix="rlvr-code-")
      argv, cwd = [_interpreter()[0], "-I", "-B", "-c", _driver_source()], self._tmp.name
    try:
      self._cgroups = _RunCgroups(bases, limits)
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


def _cgroups_if_any() -> dict[str, str]:
  """The cgroups for sandbox="none": the same as bwrap's where there are some."""
  try:
    return cgroup_bases()
  except CodeSandboxError:
    return {}


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
      if judge_user() is None:
        raise
      _judge_uid.append(None)  # bubblewrap in a user namespace, the judge as its uid 0
      try:
        _probe(path)
      except CodeSandboxError:
        _judge_uid.clear()
        raise as_root from None
      _LOG.warning(
        "code sandbox: bubblewrap cannot run as real root here, so the judge keeps uid 0 "
        "(the host's root, without capabilities) in a user namespace: %s",
        as_root,
      )
    if syscall_filter() is None:
      _LOG.warning(
        "code sandbox: no system call filter on %s (it is built for x86-64); as root the "
        "judge keeps uid 0 (the host's root, without capabilities) in a user namespace",
        platform.machine(),
      )
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
