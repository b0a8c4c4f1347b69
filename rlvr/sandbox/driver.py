"""The judge inside the sandbox: runs one program on its test cases, one process per case.

Started as `python -I -B -c <this file's source>` (standard library only, nothing of rlvr),
as PID 1 of the sandbox's PID namespace under bubblewrap. It reads the job, JSON, from
stdin and writes JSON lines to stdout: `{"ready": 1}`, then one per case (`{"case": i,
"status": ..., "stdout" | "value": ..., "detail": ...}`), then `{"done": 1}`. Outputs are
compared by the host; expected outputs never enter the sandbox (an assert-based check carries
its own).

Nothing inside can write those lines for it: it makes itself non-dumpable, so no other
process of the sandbox may open its /proc entries (its stdout pipe among them) or trace it;
as PID 1 it ignores every signal sent from inside that it does not handle (SIGKILL and
SIGSTOP too; it handles none). Each case runs in a fork with fresh fds 0-3 (stdin, stdout,
/dev/null, the result pipe) and its rlimits; when the case ends, every other process in the
namespace is killed (`kill(-1, SIGKILL)`), so nothing of one case outlives it, and what it
left is removed: every file in the working dir (the sandbox's tmpfs at /tmp) and every
System V object of the sandbox's IPC namespace (POSIX message queues, which nothing in here
can list, the syscall filter refuses). Each case starts from what the first one found.

The verdict is the judge's. A case's process is the program's, so its result line on fd 3 is
the program's word: the judge takes from it only what a program may say of itself (`_SAID`)
and a detail (text, cut to `_DETAIL_CHARS`); `timeout` and `output_limit` it decides from
what it sees (its clock and caps, the case's CPU time, a full tmpfs). Any other status in
that line is a `runtime_error`.

Outside a PID namespace (the trusted `sandbox="none"`) the same code kills the case's process
group instead, and leaves IPC objects alone.

Nothing outlives the host: while a case runs the judge checks that the host still reads its
stdout (the pipe's reader ends with the host, kill -9 included); when it does not, the judge
kills the case and exits, and in a PID namespace the kernel ends every process with it.
"""

import builtins
import errno
import json
import os
import resource
import select
import signal
import stat
import sys
import time

_RESULT_FD = 3
_MAX_FD = 1024
_POLL_S = 0.01
_MAX_DEPTH = 100  # a returned value nested deeper is not judged (the host parses every line)
_DETAIL_CHARS = 300
# What a result line may say of its case: the outcomes a program reaches inside its own
# process. A MemoryError is one: RLIMIT_AS fails there, out of the judge's sight (and one
# oversized allocation gets that verdict anyway); a timeout or an output cap is not.
_SAID = ("ok", "wrong_answer", "runtime_error", "memory")
_CPU_SEEN = 0.9  # a case killed for CPU time has used at least this share of its limit
_FULL = 16  # a tmpfs with less than 1/_FULL of it free is full
_KEYCTL_JOIN_SESSION_KEYRING = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_IPC_RMID = 0


def _write_all(fd, data):
  """Writes every byte of `data` to fd."""
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]


def _send(msg):
  """One report line to the host (unbuffered: a fork must not inherit pending output)."""
  _write_all(1, (json.dumps(msg) + "\n").encode())


def _read_fd(fd):
  """All bytes of fd up to EOF."""
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return b"".join(chunks)
    chunks.append(chunk)


def _set_limit(which, value):
  """Soft and hard limit `value`, or the current hard limit where that is lower."""
  _, hard = resource.getrlimit(which)
  value = value if hard == resource.RLIM_INFINITY else min(value, hard)
  resource.setrlimit(which, (value, value))


def _non_dumpable():
  """prctl(PR_SET_DUMPABLE, 0): our /proc files and memory are closed to the other processes."""
  import ctypes

  if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _harden(harden):
  """A fresh session keyring, then the unprivileged uid, then the syscall filter (each step
  needs what the next one takes away); what the host asked for in `harden`."""
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  if harden.get("keyctl") is not None:
    nr, op = ctypes.c_long(harden["keyctl"]), ctypes.c_long(_KEYCTL_JOIN_SESSION_KEYRING)
    if libc.syscall(nr, op, ctypes.c_void_p(None)) < 0:  # a new anonymous session keyring
      raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING) failed")
  uid = harden.get("uid")
  if uid is not None and os.getuid() == 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # clears every capability
    if 0 in os.getresuid() or 0 in os.getresgid():
      raise OSError(errno.EPERM, f"could not drop to uid {uid}")
  if harden.get("seccomp"):
    program = bytes.fromhex(harden["seccomp"])

    class SockFprog(ctypes.Structure):
      _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // 8, program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _remove_ipc_objects():
  """Removes every System V object (shared memory, message queue, semaphore set) of the
  sandbox's own IPC namespace: each outlives the processes that made it."""
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  for kind in ("shm", "msg", "sem"):
    try:
      ids = [int(row.split()[1]) for row in open(f"/proc/sysvipc/{kind}").readlines()[1:]]
    except OSError:
      continue
    for ipc_id in ids:
      if kind == "sem":
        libc.semctl(ipc_id, 0, _IPC_RMID)
      else:
        getattr(libc, f"{kind}ctl")(ipc_id, _IPC_RMID, None)


def _is_dir(path):
  return stat.S_ISDIR(os.lstat(path).st_mode)


def _empty_working_dir():
  """Removes everything in the working dir, with no recursion and no link followed: a
  directory's subdirectories move up into the working dir, then it goes (so no path grows,
  however deep the tree). Every process of the case has ended, and each ran as our uid, so a
  directory it closed to us we may open again."""
  spare = 0
  while True:
    try:
      progress, names = False, os.listdir(".")
    except OSError:
      return
    for name in names:
      try:
        if not _is_dir(name):
          os.unlink(name)
        else:
          os.chmod(name, 0o700)
          for child in os.listdir(name):
            path = os.path.join(name, child)
            if _is_dir(path):
              while os.path.lexists(f".{spare}"):
                spare += 1
              os.chmod(path, 0o700)  # a move rewrites its ".."
              os.rename(path, f".{spare}")
            else:
              os.unlink(path)
          os.rmdir(name)
        progress = True
      except OSError:
        pass
    if not names or not progress:
      return


def _tmpfs_full(file_bytes):
  """Whether the working dir's file system, a tmpfs of `file_bytes`, is full: what a file at
  RLIMIT_FSIZE (of the same size) or a write refused with ENOSPC leaves."""
  try:
    st = os.statvfs(".")
  except OSError:
    return False
  return st.f_bavail * st.f_frsize * _FULL < file_bytes


def _detail(value):
  """A result line's detail as text: a str, cut to `_DETAIL_CHARS`, else nothing."""
  return value[:_DETAIL_CHARS] if isinstance(value, str) else ""


def _too_deep(value):
  """Whether a JSON value nests lists and dicts more than `_MAX_DEPTH` levels."""
  stack = [(value, 1)]
  while stack:
    value, depth = stack.pop()
    if isinstance(value, (list, dict)):
      if depth > _MAX_DEPTH:
        return True
      stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
  return False


# ---------------------------------------------------------------------------
# Inside a case's process.


def _plain(value):
  """json.dumps fallback: sets as sorted lists; anything else is not a value we can judge."""
  if isinstance(value, (set, frozenset)):
    try:
      return sorted(value)
    except TypeError:
      return list(value)
  raise TypeError(f"a {type(value).__name__} is not JSON-serializable")


def _call(ns, fn_name, args):
  """fn_name(*args), a top-level function or a method of a `Solution` class (LeetCode style)."""
  fn = ns.get(fn_name)
  if not callable(fn) and isinstance(ns.get("Solution"), type):
    fn = getattr(ns["Solution"](), fn_name, None)
  if not callable(fn):
    raise NameError(f"function {fn_name!r} is not defined")
  return fn(*args) if isinstance(args, list) else fn(args)


def _check(ns, test, entry_point):
  """Runs the test code in the program's namespace, then check(candidate) if it defines one."""
  exec(compile(test, "test.py", "exec"), ns)
  if entry_point and callable(ns.get("check")):
    if entry_point not in ns:
      raise NameError(f"entry point {entry_point!r} is not defined")
    ns["check"](ns[entry_point])


def _run_case(job, case):
  """Runs the program on one case in this process; returns the result message."""
  kind = job["kind"]
  sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
  sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
  sys.stderr = open(2, "w", closefd=False)
  sys.argv = ["solution.py"]
  ns = {"__name__": "__main__" if kind == "stdio" else "solution", "__builtins__": builtins}
  result = {"status": "ok"}
  try:
    exec(compile(job["program"], "solution.py", "exec"), ns)
    if kind == "call":
      result["value"] = json.loads(json.dumps(_call(ns, job["fn_name"], case), default=_plain))
    elif kind == "assert":
      _check(ns, job["test"], job.get("entry_point"))
  except SystemExit as e:
    if kind != "stdio" or e.code not in (None, 0):
      result = {"status": "runtime_error", "detail": f"SystemExit({e.code!r})"}
  except AssertionError as e:
    status = "wrong_answer" if kind == "assert" else "runtime_error"
    result = {"status": status, "detail": f"AssertionError: {str(e)[:200]}"}
  except MemoryError:
    result = {"status": "memory", "detail": "MemoryError"}
  except OSError as e:
    status = "output_limit" if e.errno in (errno.EFBIG, errno.ENOSPC) else "runtime_error"
    result = {"status": status, "detail": f"{type(e).__name__}: {str(e)[:200]}"}
  except BaseException as e:  # noqa: BLE001 - whatever the program raises is its failure
    result = {"status": "runtime_error", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
  try:
    sys.stdout.flush()
  except BaseException:  # noqa: BLE001 - the judge stopped reading (output cap) or the like
    pass
  return result


def _case_main(job, case, input_fd, out_w, res_w, in_namespace):
  """The forked case process: fresh fds and limits, run, report on fd 3, exit."""
  code = 1
  try:
    null = os.open(os.devnull, os.O_WRONLY)
    for src, dst in ((input_fd, 0), (out_w, 1), (null, 2), (res_w, _RESULT_FD)):
      os.dup2(src, dst)
    os.closerange(_RESULT_FD + 1, _MAX_FD)
    if not in_namespace:
      os.setpgid(0, 0)  # its group is what gets killed
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lim = job["limits"]
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    _set_limit(resource.RLIMIT_FSIZE, lim["file_bytes"])
    _set_limit(resource.RLIMIT_AS, lim["memory_bytes"])
    result = _run_case(job, case)
    try:
      line = json.dumps(result)
    except (TypeError, ValueError, RecursionError) as e:
      line = json.dumps({"status": "runtime_error", "detail": f"unreportable result: {e}"})
    _write_all(_RESULT_FD, ("\n" + line + "\n").encode())
    code = 0
  except MemoryError:
    try:
      _write_all(_RESULT_FD, b'\n{"status": "memory", "detail": "MemoryError"}\n')
    except BaseException:  # noqa: BLE001
      pass
  finally:
    os._exit(code)


# ---------------------------------------------------------------------------
# The judge: one case at a time.


def _host_gone():
  """Whether the host has ended (however: kill -9 too): our stdout's reader is gone. A parent-
  death signal would not do: the uid drop clears it, and bubblewrap may not signal nobody."""
  poll = select.poll()
  poll.register(1, select.POLLERR)
  return bool(poll.poll(0))


def _input_fd(text):
  """A readable fd holding `text` (a memfd: no file system needed)."""
  fd = os.memfd_create("stdin")
  _write_all(fd, text.encode())
  os.lseek(fd, 0, os.SEEK_SET)
  return fd


def _reap(child, statuses):
  """Reaps every exited process; records the case process's (status, cpu seconds)."""
  while True:
    try:
      pid, status, usage = os.wait3(os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    if pid == child:
      statuses[child] = (status, usage.ru_utime + usage.ru_stime)


def _kill_rest(child, statuses, in_namespace):
  """Kills every process of the case (all processes but us in a PID namespace) and reaps."""
  for _ in range(1000):
    try:
      if in_namespace:
        os.kill(-1, signal.SIGKILL)
      else:
        os.killpg(child, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    time.sleep(0.001)
    _reap(child, statuses)
    if child in statuses and (not in_namespace or _no_children()):
      return
  if child not in statuses:  # pragma: no cover - a process stuck in D state
    statuses[child] = (signal.SIGKILL, 0.0)


def _no_children():
  """True when no child process is left (one that exited meanwhile is reaped)."""
  try:
    os.waitpid(-1, os.WNOHANG)
  except ChildProcessError:
    return True
  return False


def _classify(kind, status, cpu_s, lim, data):
  """(status, detail) from the case's wait status, its CPU time, the tmpfs, and what it wrote
  on fd 3 (`data`): the program's word only for what `_SAID` holds."""
  if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    try:
      name = signal.Signals(sig).name
    except ValueError:
      name = str(sig)
    if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu_s >= _CPU_SEEN * lim["cpu_s"]:
      return "timeout", f"CPU limit ({name})"
    if sig == signal.SIGXFSZ and _tmpfs_full(lim["file_bytes"]):
      return "output_limit", "file size limit (SIGXFSZ)"
    return "runtime_error", f"killed by {name}"
  code = os.WEXITSTATUS(status)
  try:
    result = _last_result(data)
  except RecursionError:
    return "judge_error", "a result nested too deep to read"
  if result is not None:
    said, detail = result.get("status"), _detail(result.get("detail"))
    if said in _SAID:
      return said, detail
    if said == "output_limit" and _tmpfs_full(lim["file_bytes"]):
      return said, detail  # a write refused for its size (EFBIG) or for space (ENOSPC)
    return "runtime_error", detail or "a result whose status is not the program's to give"
  if kind == "stdio" and code == 0:
    return "ok", ""
  return "runtime_error", f"exited with status {code} and no result"


def _last_result(data):
  """The last well-formed result line the case wrote on fd 3, or None; RecursionError where
  that line nests too deep to read."""
  for line in reversed(data.split(b"\n")):
    if line.strip():
      try:
        msg = json.loads(line)
      except ValueError:
        return None
      return msg if isinstance(msg, dict) else None
  return None


def _run_one(job, index, case, in_namespace):
  """Forks the case's process, watches it to the end (wall, output caps), reports the case."""
  lim = job["limits"]
  input_fd = _input_fd(case if job["kind"] == "stdio" else "")
  out_r, out_w = os.pipe()
  res_r, res_w = os.pipe()
  child = os.fork()
  if child == 0:
    _case_main(job, case, input_fd, out_w, res_w, in_namespace)
  if not in_namespace:
    try:
      os.setpgid(child, child)  # also here: no race with the kill below
    except OSError:
      pass
  for fd in (input_fd, out_w, res_w):
    os.close(fd)
  bufs = {out_r: bytearray(), res_r: bytearray()}
  caps = {out_r: lim["output_bytes"], res_r: lim["output_bytes"] + (1 << 16)}
  open_fds, statuses, verdict = [out_r, res_r], {}, None
  deadline = time.monotonic() + lim["wall_s"]
  while verdict is None:
    _reap(child, statuses)
    if _host_gone():  # no one to report to: end the case, then ourselves
      _kill_rest(child, statuses, in_namespace)
      os._exit(1)
    left = deadline - time.monotonic()
    if left <= 0:
      verdict = ("timeout", f"wall limit ({lim['wall_s']} s)")
      break
    ready = select.select(open_fds, [], [], min(left, _POLL_S))[0] if open_fds else []
    if not open_fds:
      time.sleep(min(left, _POLL_S))
    for fd in ready:
      chunk = os.read(fd, 1 << 16)
      if not chunk:
        open_fds.remove(fd)
      bufs[fd] += chunk
      if len(bufs[fd]) > caps[fd]:
        verdict = ("output_limit", f"more than {lim['output_bytes']} bytes of output")
    if child in statuses and not ready:
      break  # exited and its pipes are drained
  _kill_rest(child, statuses, in_namespace)
  for fd in (out_r, res_r):
    os.close(fd)
  status, cpu_s = statuses[child]
  if verdict is None:
    verdict = _classify(job["kind"], status, cpu_s, lim, bytes(bufs[res_r]))
  _empty_working_dir()  # after _classify, which looks at how full it is
  if in_namespace:  # the sandbox's own IPC namespace
    _remove_ipc_objects()
    try:
      os.chmod(".", 0o1777)  # as bubblewrap made it, where a program (its owner) changed it
    except OSError:
      pass
  msg = {"case": index, "status": verdict[0], "detail": verdict[1]}
  if job["kind"] == "stdio" and verdict[0] != "output_limit":
    # printed output, also of a failed run (a tool call shows it beside the error)
    msg["stdout"] = bufs[out_r].decode("utf-8", "replace")
  elif verdict[0] == "ok" and job["kind"] == "call":
    result = _last_result(bytes(bufs[res_r]))
    msg["value"] = result.get("value") if result else None
    if _too_deep(msg["value"]):
      msg = {"case": index, "status": "judge_error"}
      msg["detail"] = f"the returned value nests deeper than {_MAX_DEPTH} levels"
  return msg


def main():
  """Reads the job from stdin, runs every case, reports each on stdout."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _non_dumpable()
  job = json.loads(_read_fd(0))
  _harden(job.get("harden") or {})
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  in_namespace = os.getpid() == 1
  _set_limit(resource.RLIMIT_CORE, 0)
  if job["limits"].get("nproc"):
    _set_limit(resource.RLIMIT_NPROC, job["limits"]["nproc"])
  _send({"ready": 1})
  for index, case in enumerate(job["cases"]):
    _send(_run_one(job, index, case, in_namespace))
  _send({"done": 1})


if __name__ == "__main__":
  main()
