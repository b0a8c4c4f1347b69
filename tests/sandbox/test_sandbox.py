"""The code reward with the real bubblewrap sandbox: hostile programs, and every test format.

Each hostile program must score 0 with a named reason, leave nothing behind, and the judge
must serve a normal program right after it within `NEXT_S`. Short limits keep the file fast.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import pathlib
import platform
import secrets
import shutil
import socket
import time

import numpy as np
import paths
import pytest

from rlvr.rewards import code
from rlvr.sandbox import bwrap as sandbox_lib
from rlvr.sandbox import cgroups as cgroups_lib
from rlvr.sandbox import seccomp as seccomp_lib

REPO = pathlib.Path(paths.REPO)
LIMITS = code.CodeLimits(
  cpu_s=1,
  wall_s=1.5,
  memory_bytes=256 << 20,
  processes=16,
  output_bytes=64 << 10,
  file_bytes=1 << 20,
)
CFG = code.CodeRewardConfig(limits=LIMITS, extraction="whole")
DOUBLE = {"inputs": ["2\n", "21\n"], "outputs": ["4", "42"]}
NEXT_S = 5.0  # a normal program right after a hostile one, at most


@pytest.fixture(scope="module", autouse=True)
def real_sandbox():
  code.check_sandbox("bwrap")  # fails (never skips) where bubblewrap is missing


def _parent(pid: int) -> int:
  """The parent of `pid` (0 once it is gone)."""
  try:
    stat = pathlib.Path("/proc", str(pid), "stat").read_text()
  except OSError:
    return 0
  return int(stat.rsplit(")", 1)[1].split()[1])


def _another_workers(pid: int) -> bool:
  """Whether `pid` descends from another process of this session's pytest (the other
  pytest-xdist worker runs sandboxes of its own meanwhile): its parents reach this
  process's parent without passing through this process."""
  while pid > 1:
    pid = _parent(pid)
    if pid == os.getpid():
      return False
    if pid == os.getppid() and "PYTEST_XDIST_WORKER" in os.environ:
      return True
  return False


def _judge_processes() -> list[int]:
  """PIDs of judges (and their forks) alive on the host, found by their argv: this
  process's and orphans, not those another pytest-xdist worker is running."""
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        cmdline = pathlib.Path("/proc", entry, "cmdline").read_bytes()
      except OSError:
        continue
      if b"The judge inside the sandbox" in cmdline and not _another_workers(int(entry)):
        found.append(int(entry))
  return found


def _with_marker(marker: str) -> list[int]:
  pids = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        if marker.encode() in pathlib.Path("/proc", entry, "cmdline").read_bytes():
          pids.append(int(entry))
      except OSError:
        pass
  return pids


def _hostile(program: str, tests=DOUBLE, limits=LIMITS) -> tuple[code.Verdict, float]:
  """Scores `program` (reward must be 0), then checks the judge still serves within NEXT_S."""
  start = time.monotonic()
  result = code.score([program], [tests], dataclasses.replace(CFG, limits=limits))
  elapsed = time.monotonic() - start
  assert result.rewards.tolist() == [0.0], result.verdicts
  verdict = result.verdicts[0]
  assert verdict.reason in code.REASONS and verdict.reason != "ok"
  start = time.monotonic()
  assert code.run_tests("print(int(input()) * 2)", DOUBLE, LIMITS).reason == "ok"
  assert time.monotonic() - start < NEXT_S
  assert not _judge_processes(), "a judge or one of its processes outlived its run"
  return verdict, elapsed


# ---------------------------------------------------------------------------
# Hostile programs.


def test_fork_bomb():
  verdict, elapsed = _hostile("import os\nwhile True:\n  os.fork()\n")
  assert verdict.reason in ("runtime_error", "timeout"), verdict
  assert elapsed < 2 * LIMITS.wall_s + 5


def test_fork_bomb_that_swallows_errors_hits_the_limits():
  program = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  verdict, _ = _hostile(program)
  assert verdict.reason == "timeout", verdict


def test_process_cap():
  """At most `processes` processes at once: the 20th sleeping child cannot be forked."""
  program = (
    "import os, time\nn = 0\nfor _ in range(20):\n  try:\n    if os.fork() == 0:\n"
    "      time.sleep(5); os._exit(0)\n    n += 1\n  except OSError:\n    break\n"
    "print(n)\n"
  )
  verdict, _ = _hostile(program, {"inputs": [""], "outputs": ["20"]})
  assert verdict.reason == "wrong_answer", verdict
  assert int(verdict.detail.split("got ")[1].strip("'\\n")) < LIMITS.processes


def test_busy_loop():
  verdict, elapsed = _hostile("while True:\n  pass\n")
  assert verdict.reason == "timeout", verdict
  assert elapsed < LIMITS.wall_s + 5


def test_sleeping_program_hits_the_wall_limit():
  verdict, elapsed = _hostile("import time\ntime.sleep(60)\n")
  assert verdict.reason == "timeout" and "wall" in verdict.detail, verdict
  assert elapsed < LIMITS.wall_s + 5


@pytest.mark.parametrize(
  "program",
  [
    "x = bytearray(2 ** 34)\n",
    "chunks = []\nwhile True:\n  chunks.append(bytearray(10 ** 7))\n",
  ],
  ids=["one_16GiB", "growing"],
)
def test_memory_bomb(program):
  # Time enough that a busy machine still reaches the memory limit before the clock.
  verdict, _ = _hostile(program, limits=dataclasses.replace(LIMITS, cpu_s=10, wall_s=20))
  assert verdict.reason == "memory", verdict


@pytest.mark.parametrize(
  "program",
  [
    "while True:\n  print('x' * 1000)\n",
    "import sys\nwhile True:\n  sys.stdout.write('y' * 4096)\n",
  ],
  ids=["lines", "no_newlines"],
)
def test_output_flood(program):
  verdict, elapsed = _hostile(program)
  assert verdict.reason == "output_limit", verdict
  assert elapsed < LIMITS.wall_s + 5


def test_large_file():
  verdict, _ = _hostile("open('big', 'wb').write(b'z' * (4 << 20))\nprint(4)\n")
  assert verdict.reason == "output_limit", verdict


def test_no_network_to_the_hosts_loopback():
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    program = (
      f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
      "s.sendall(b'leak')\nprint(int(input()) * 2)\n"
    )
    verdict, _ = _hostile(program)
    assert verdict.reason == "runtime_error" and "ConnectionRefused" in verdict.detail, verdict
    with pytest.raises(socket.timeout):
      server.accept()


def test_cannot_write_outside(tmp_path):
  targets = [tmp_path / "sub" / "escaped.txt", REPO / f".escaped-{secrets.token_hex(4)}"]
  program = (
    "import os\nfor p in %r:\n  try:\n    os.makedirs(os.path.dirname(p), exist_ok=True)\n"
    "    open(p, 'w').write('escaped')\n  except OSError:\n    pass\nprint('done')\n"
    % [str(t) for t in targets]
  )
  verdict, _ = _hostile(program, {"inputs": [""], "outputs": ["never"]})
  assert verdict.reason == "wrong_answer", verdict
  assert not any(t.exists() for t in targets)


def test_cannot_read_home_work_dir_or_host_tmp(tmp_path):
  """A planted secret (home, host /tmp) or a repo file is the expected output: reading is passing."""
  secret = secrets.token_hex(16)
  home_file = pathlib.Path.home() / f".rlvr-code-secret-{secret[:8]}"
  tmp_file = tmp_path / "secret.txt"
  for f in (home_file, tmp_file):
    f.write_text(secret)
  try:
    for path, content in (
      (home_file, secret),
      (tmp_file, secret),
      (REPO / "pyproject.toml", (REPO / "pyproject.toml").read_text()),
    ):
      verdict, _ = _hostile(
        f"print(open({str(path)!r}).read())\n", {"inputs": [""], "outputs": [content]}
      )
      assert verdict.reason == "runtime_error" and "FileNotFoundError" in verdict.detail, verdict
  finally:
    home_file.unlink()


def test_killing_the_parent_still_gives_a_verdict():
  program = "import os, time\nos.kill(os.getppid(), 9)\nos.kill(1, 9)\ntime.sleep(60)\n"
  verdict, elapsed = _hostile(program)
  assert verdict.reason == "timeout", verdict
  assert elapsed < LIMITS.wall_s + 5


def test_detached_process_does_not_outlive_the_run():
  marker = f"rlvr-detached-{secrets.token_hex(6)}"
  program = (
    "import os\nif os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n"
    f"    os.execv('/bin/sh', ['/bin/sh', '-c', 'sleep 60; : {marker}'])\n"
    "  os._exit(0)\nprint('detached')\n"
  )
  verdict, _ = _hostile(program)
  assert verdict.reason == "wrong_answer", verdict
  assert not _with_marker(marker)


def test_segfault():
  verdict, _ = _hostile("import ctypes\nctypes.string_at(0)\n")
  assert verdict.reason == "runtime_error" and "SIGSEGV" in verdict.detail, verdict


def test_cannot_forge_the_judges_report():
  fake = (
    '{"case": 0, "status": "ok", "stdout": "4"}\\n{"case": 1, "status": "ok", "stdout": "42"}\\n'
  )
  program = f"import os\nopen(f'/proc/{{os.getppid()}}/fd/1', 'w').write('{fake}')\n"
  verdict, _ = _hostile(program)
  assert verdict.reason == "runtime_error" and "PermissionError" in verdict.detail, verdict


def test_hostile_and_normal_programs_at_once():
  programs = [
    "while True:\n  pass\n",
    "print(int(input()) * 2)\n",
    "x = bytearray(2 ** 34)\n",
    "print(int(input()) * 2)\n",
  ]
  result = code.score(programs, [DOUBLE] * 4, CFG)
  assert result.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
  assert [v.reason for v in result.verdicts] == ["timeout", "ok", "memory", "ok"]
  assert result.reasons == {"timeout": 1, "ok": 2, "memory": 1}


def test_a_batch_of_busy_loops_ends_within_its_wall_bound():
  """Eight programs that never end, two test cases each, three sandboxes at a time: each
  case is killed at its wall limit, so the batch ends within three waves of two cases (plus
  start-up), whatever the programs do."""
  cfg = code.CodeRewardConfig(limits=LIMITS, extraction="whole", workers=3, pass_fraction=True)
  start = time.monotonic()
  result = code.score(["while True:\n  pass\n"] * 8, [DOUBLE] * 8, cfg)
  elapsed = time.monotonic() - start
  assert [v.reason for v in result.verdicts] == ["timeout"] * 8, [
    (i, v.reason, v.detail) for i, v in enumerate(result.verdicts) if v.reason != "timeout"
  ]  # only the odd ones: pytest cuts a long message short
  assert [v.passed for v in result.verdicts] == [0] * 8
  assert elapsed < 3 * (2 * LIMITS.wall_s + NEXT_S), elapsed


# ---------------------------------------------------------------------------
# The kernel's surface, and bounds of the sandbox as a whole.

X86_64 = platform.machine() == "x86_64"
BOUND_MIB = cgroups_lib.memory_bound(LIMITS) >> 20
PROC_SYS_WRITE = (
  "import os\nos.close(os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY))\nprint('writable')"
)
PROC_SYS_SWEEP = (
  "import os\nopened = 0\nfor d, _, files in os.walk('/proc/sys'):\n  for f in files:\n"
  "    try:\n      os.close(os.open(os.path.join(d, f), os.O_WRONLY))\n      opened += 1\n"
  "    except OSError:\n      pass\nprint(opened)\n"
)


@pytest.fixture(params=["as_run", "root_in_a_user_namespace"])
def judge_mode(request, monkeypatch):
  """The judge as this host runs it, and (on a root x86-64 host) the user-namespace judge
  that a root host without the syscall filter runs: uid 0 of the host, no capabilities."""
  if request.param == "root_in_a_user_namespace":
    if seccomp_lib.judge_user() is None:
      pytest.skip("the judge runs in a user namespace here anyway")
    monkeypatch.setattr(seccomp_lib, "judge_user", lambda: None)
    monkeypatch.setattr(seccomp_lib, "syscall_filter", lambda: None)
  return request.param


def test_proc_sys_is_not_writable(judge_mode):
  verdict, _ = _hostile(PROC_SYS_WRITE, {"inputs": [""], "outputs": ["writable"]})
  assert verdict.reason == "runtime_error", verdict
  assert "PermissionError" in verdict.detail or "Read-only" in verdict.detail, verdict
  sweep = code.run_tests(PROC_SYS_SWEEP, {"inputs": [""], "outputs": ["0"]}, LIMITS)
  assert sweep.reason == "ok", sweep  # not one /proc/sys file opens for writing


@pytest.mark.skipif(os.geteuid() != 0 or not X86_64, reason="the judge drops to nobody as root")
def test_the_judge_runs_as_nobody_without_capabilities():
  program = (
    "import os\ndef who():\n  caps = [l.split()[1] for l in open('/proc/self/status')\n"
    "          if l.startswith(('CapPrm', 'CapEff', 'CapAmb'))]\n"
    "  return [*os.getresuid(), *os.getresgid(), os.getgroups(), caps]\n"
  )
  nobody = seccomp_lib.NOBODY
  want = [nobody] * 6 + [[], ["0000000000000000"] * 3]
  tests = {"fn_name": "who", "inputs": [[]], "outputs": [want]}
  assert code.run_tests(program, tests, LIMITS).reason == "ok"


@pytest.fixture
def planted_key():
  """A user key in this process's session keyring: (serial, description, payload)."""
  if not X86_64:
    pytest.skip("add_key / keyctl system call numbers of x86-64")
  libc = ctypes.CDLL(None, use_errno=True)
  desc, payload = f"rlvr-test-{secrets.token_hex(4)}".encode(), secrets.token_hex(8).encode()
  args = (b"user", desc, payload, ctypes.c_size_t(len(payload)), ctypes.c_long(-3))
  serial = libc.syscall(ctypes.c_long(248), *args)  # add_key(..., KEY_SPEC_SESSION_KEYRING)
  assert serial > 0, os.strerror(ctypes.get_errno())
  yield serial, desc.decode(), payload.decode()
  libc.syscall(ctypes.c_long(250), ctypes.c_long(21), ctypes.c_long(serial))  # invalidate


def test_the_hosts_session_keyring_is_not_the_sandboxs(planted_key, judge_mode):
  serial, desc, payload = planted_key
  program = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\ndef steal():\n"
    "  buf = ctypes.create_string_buffer(64)\n"
    f"  n = libc.syscall(ctypes.c_long(250), ctypes.c_long(11), ctypes.c_long({serial}), buf, "
    "ctypes.c_long(64))\n"  # keyctl(KEYCTL_READ, serial, buf, 64)
    f"  return [buf.raw[:max(n, 0)].decode(), {desc!r} in open('/proc/keys').read()]\n"
  )
  stolen = {"fn_name": "steal", "inputs": [[]], "outputs": [[payload, True]]}
  verdict, _ = _hostile(program, stolen)
  assert verdict.reason == "wrong_answer", verdict
  # As nobody the key is not even listed; root in a user namespace may see its description
  # (the key's owner is uid 0), never its payload.
  listed = judge_mode != "as_run" or seccomp_lib.judge_user() is None
  nothing = {"fn_name": "steal", "inputs": [[]], "outputs": [["", listed]]}
  assert code.run_tests(program, nothing, LIMITS).reason == "ok"


MEMFD_HOARD = f"""import os, resource, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
chunk, pinned = b"x" * (512 << 10), 0
while pinned < {4 * BOUND_MIB} * 2:
  try:
    fd = os.memfd_create("hoard")
  except OSError:  # out of fds: a child carries on with fresh ones, the parent keeps its own
    if os.fork():
      time.sleep(60)
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    continue
  os.write(fd, chunk)
  pinned += 1
print(pinned)
"""
SHM_HOARD = f"""import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range({4 * BOUND_MIB} // 32):
  shmid = libc.shmget(0, 32 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
  addr = libc.shmat(shmid, None, 0)
  ctypes.memset(addr, 1, 32 << 20)
  libc.shmdt(ctypes.c_void_p(addr))  # the segment stays, out of the address space
print("pinned")
"""


@pytest.mark.skipif(
  "memory" not in cgroups_lib.cgroup_bases(), reason="no writable memory cgroup here"
)
@pytest.mark.parametrize("program", [MEMFD_HOARD, SHM_HOARD], ids=["memfd", "sysv_shm"])
def test_memory_outside_the_address_space_is_bounded(program):
  """Four times the run's memory bound, in memfd files or System V shared memory (neither
  counts in RLIMIT_AS): the run never holds more than its bound, and the program is killed
  (by the kernel at the bound, or at the wall limit while the kernel reclaims)."""
  tests = code.parse_tests({"inputs": [""], "outputs": ["pinned"]})
  with sandbox_lib.SandboxedJudge(tests.job(program, LIMITS), LIMITS, "bwrap") as run:
    msgs = list(run.messages(time.monotonic() + 30))
    peak = run.memory_peak()
  assert not any(m.get("status") == "ok" for m in msgs), msgs
  assert 0 < peak <= BOUND_MIB << 20, peak
  verdict, _ = _hostile(program, tests)
  assert verdict.reason in ("memory", "timeout"), verdict


def test_shared_memory_does_not_outlive_its_case():
  program = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "print('fresh' if libc.shmget(0x5EED, 4096, 0o3600) >= 0 else 'left over')\n"
  )  # IPC_CREAT | IPC_EXCL: fails where an earlier case's segment is left
  tests = {"inputs": ["", ""], "outputs": ["fresh", "fresh"]}
  assert code.run_tests(program, tests, LIMITS) == code.Verdict(2, 2, "ok")


def test_the_tmpfs_holds_file_bytes_in_all():
  program = (
    "for i in range(8):\n  open(f'f{i}', 'wb').write(b'z' * (%d // 2))\nprint(4)\n"
    % LIMITS.file_bytes
  )  # each file under RLIMIT_FSIZE, four times the tmpfs in all
  verdict, _ = _hostile(program, {"inputs": [""], "outputs": ["4"]})
  assert verdict.reason == "output_limit" and "No space" in verdict.detail, verdict


@pytest.mark.skipif(not X86_64, reason="the syscall filter is built for x86-64")
def test_the_syscall_filter_refuses_what_no_judge_needs():
  program = """import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
CALLS = {
  "ptrace": (101, 0, 0, 0, 0),  # PTRACE_TRACEME
  "unshare": (272, 0x10000000),  # CLONE_NEWUSER
  "setns": (308, 0, 0),
  "mount": (165, 0, 0, 0, 0, 0),
  "keyctl": (250, 0, -3, 0),  # KEYCTL_GET_KEYRING_ID
  "bpf": (321, 0, 0, 0),
  "perf_event_open": (298, 0, 0, -1, -1, 0),
  "userfaultfd": (323, 0),
  "io_uring_setup": (425, 1, 0),
  "clone3": (435, 0, 0),
}
def probe():
  out = {}
  for name, (nr, *args) in CALLS.items():
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    out[name] = ctypes.get_errno() if ret == -1 else "allowed"
  box = []
  t = threading.Thread(target=box.append, args=("thread",))
  t.start()
  t.join()
  out["thread"] = box[0]
  out["subprocess"] = subprocess.run(["/bin/echo", "child"], capture_output=True).stdout.decode()
  return out
"""
  want = {name: errno.EPERM for name in ("ptrace", "unshare", "setns", "mount", "keyctl", "bpf")}
  want |= {"perf_event_open": errno.EPERM, "userfaultfd": errno.EPERM}
  want |= {"io_uring_setup": errno.EPERM, "clone3": errno.ENOSYS}
  want |= {"thread": "thread", "subprocess": "child\n"}
  tests = {"fn_name": "probe", "inputs": [[]], "outputs": [want]}
  verdict = code.run_tests(program, tests, LIMITS)
  assert verdict.reason == "ok", verdict


# ---------------------------------------------------------------------------
# Formats, in the sandbox.


def test_stdio_pass_and_fail():
  assert code.run_tests("print(int(input()) * 2)", DOUBLE, LIMITS) == code.Verdict(2, 2, "ok")
  v = code.run_tests("n = int(input())\nprint(4)", DOUBLE, LIMITS)
  assert (v.passed, v.total, v.reason) == (1, 2, "wrong_answer") and v.detail.startswith("test 1")


def test_stdio_whitespace_and_float_tolerance():
  program = "print(' 1   2 ', end='\\r\\n')\nprint(1 / 3)\nprint()\n"
  tests = {"inputs": [""], "outputs": ["1 2\n0.333333\n"]}
  assert code.run_tests(program, tests, LIMITS).reason == "wrong_answer"
  assert code.run_tests(program, tests, LIMITS, float_tol=1e-6).reason == "ok"
  assert (
    code.run_tests("print('1 2 0.333333')", tests, LIMITS, float_tol=1e-6).reason == "wrong_answer"
  )  # lines still count


def test_stdio_list_of_lines_and_json_string():
  tests = '{"input": [["3", "1 2 3"]], "output": [["6"]]}'
  program = "input()\nprint(sum(map(int, input().split())))"
  assert (
    code.run_tests(program, {"inputs": [["3", "1 2 3"]], "outputs": [["6"]]}, LIMITS).reason == "ok"
  )
  assert (
    code.run_tests(program, '{"inputs": ["3\\n1 2 3\\n"], "outputs": ["6"]}', LIMITS).reason == "ok"
  )
  assert code.parse_tests(tests).kind == "stdio"


def test_call_based():
  tests = {"fn_name": "add", "inputs": [[1, 2], [0.1, 0.2]], "outputs": [3, [0.3]]}
  assert code.run_tests("def add(a, b):\n  return a + b", tests, LIMITS).reason == "wrong_answer"
  assert (
    code.run_tests("def add(a, b):\n  return a + b", tests, LIMITS, float_tol=1e-9).reason == "ok"
  )
  leet = "class Solution:\n  def add(self, a, b):\n    return round(a + b, 6)"
  assert code.run_tests(leet, tests, LIMITS).reason == "ok"
  pair = {"fn_name": "pair", "inputs": [[1]], "outputs": [[1, [1]]]}
  assert code.run_tests("def pair(a):\n  return (a, {a})", pair, LIMITS).reason == "ok"
  v = code.run_tests("def other(a, b):\n  return 3", tests, LIMITS)
  assert v.reason == "runtime_error" and "'add' is not defined" in v.detail


def test_call_based_result_cannot_fake_equality():
  program = "class Eq:\n  def __eq__(self, other):\n    return True\ndef add(a, b):\n  return Eq()"
  v = code.run_tests(program, {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}, LIMITS)
  assert v.reason == "runtime_error" and "JSON" in v.detail


def test_assert_based():
  tests = {
    "test": "def check(candidate):\n  assert candidate(3) == 9\n  assert candidate(-2) == 4\n",
    "entry_point": "square",
  }
  assert code.run_tests("def square(x):\n  return x * x", tests, LIMITS).reason == "ok"
  assert code.run_tests("def square(x):\n  return 9", tests, LIMITS).reason == "wrong_answer"
  assert code.run_tests("import sys\nsys.exit(0)", tests, LIMITS).reason == "runtime_error"
  mbpp = {"test_list": ["assert square(2) == 4", "assert square(5) == 25"]}
  assert code.run_tests("def square(x):\n  return x * x", mbpp, LIMITS).reason == "ok"
  assert code.run_tests("def square(x):\n  return 4", mbpp, LIMITS).reason == "wrong_answer"


def test_no_code_and_extraction():
  responses = [
    "I would double it.",
    "```text\nprint(4)\n```",
    "Draft:\n```python\nprint(0)\n```\nFinal:\n```python\nprint(int(input()) * 2)\n```",
    "```python\nprint(int(input()) * 2)\n",
  ]  # cut off: no closing fence
  result = code.score(responses, [DOUBLE] * 4, code.CodeRewardConfig(limits=LIMITS))
  assert [v.reason for v in result.verdicts] == ["no_code", "no_code", "ok", "no_code"]
  assert result.rewards.tolist() == [0.0, 0.0, 1.0, 0.0]
  assert code.extract_program("<think>```python\nx\n```</think>no code") is None
  assert code.extract_program("print(1)\n", "whole") == "print(1)\n"


def test_pass_fraction():
  program = "print(42)"  # fails test 0, passes test 1
  binary = code.score([program], [DOUBLE], CFG)
  fraction = code.score(
    [program],
    [DOUBLE],
    code.CodeRewardConfig(limits=LIMITS, extraction="whole", pass_fraction=True),
  )
  assert binary.rewards.tolist() == [0.0] and binary.verdicts[0].passed == 0  # stopped early
  np.testing.assert_allclose(fraction.rewards, [0.5])
  assert fraction.correct.tolist() == [False]


# ---------------------------------------------------------------------------
# Start-up checks and settings.


@pytest.fixture
def unprobed():
  """The sandbox probe forgotten for one test (and restored after it)."""
  checked, warned = dict(sandbox_lib._checked), list(sandbox_lib._warned)
  uid = list(seccomp_lib._judge_uid)
  sandbox_lib._checked.clear()
  sandbox_lib._warned.clear()
  seccomp_lib._judge_uid.clear()
  yield
  sandbox_lib._checked.clear()
  sandbox_lib._checked.update(checked)
  sandbox_lib._warned[:] = warned
  seccomp_lib._judge_uid[:] = uid


def test_missing_bwrap_is_an_error(monkeypatch, tmp_path, unprobed):
  monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap
  with pytest.raises(code.CodeSandboxError, match="apt-get install bubblewrap"):
    code.check_sandbox()
  assert not code.sandbox_available()
  with pytest.raises(code.CodeSandboxError):
    code.run_tests("print(4)", DOUBLE, LIMITS)  # never runs it some other way


def test_broken_bwrap_is_an_error(monkeypatch, tmp_path, unprobed):
  fake = tmp_path / "bwrap"  # a bwrap that cannot make namespaces, first on PATH
  fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
  fake.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
  with pytest.raises(code.CodeSandboxError, match="does not work here.*No permissions"):
    code.check_sandbox()


@pytest.mark.skipif(os.geteuid() != 0 or not X86_64, reason="the judge drops to nobody as root")
def test_bwrap_that_cannot_run_as_real_root_keeps_a_user_namespace(
  monkeypatch, tmp_path, unprobed, caplog
):
  """bubblewrap in a container without CAP_SYS_ADMIN: the real one behind a gate that refuses
  to run it without a user namespace, first on PATH."""
  gate = tmp_path / "bwrap"
  gate.write_text(
    '#!/bin/sh\ncase " $* " in *" --unshare-user "*) exec %s "$@";; esac\n'
    "echo 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n"
    % shutil.which("bwrap")
  )
  gate.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
  with caplog.at_level(logging.WARNING, logger="rlvr.sandbox.bwrap"):
    code.check_sandbox()
  assert "cannot run as real root" in caplog.text and seccomp_lib.judge_user() is None
  tests = {"fn_name": "uid", "inputs": [[]], "outputs": [0]}
  program = "import os\ndef uid():\n  return os.getuid()\n"
  assert code.run_tests(program, tests, LIMITS).reason == "ok"  # uid 0 of a user namespace


def test_unsandboxed_only_by_choice_with_a_warning(caplog, unprobed):
  with caplog.at_level(logging.WARNING, logger="rlvr.sandbox.bwrap"):
    v = code.run_tests("print(int(input()) * 2)", DOUBLE, LIMITS, sandbox="none")
  assert v.reason == "ok"
  assert "trusted code only" in caplog.text


def test_settings_are_checked():
  with pytest.raises(ValueError, match="sandbox"):
    code.CodeRewardConfig(sandbox="docker")
  with pytest.raises(ValueError, match="cpu_s"):
    code.CodeLimits(cpu_s=0)
  with pytest.raises(ValueError, match="extraction"):
    code.CodeRewardConfig(extraction="first_block")
  with pytest.raises(ValueError, match="as many outputs"):
    code.parse_tests({"inputs": ["1"], "outputs": []})
  with pytest.raises(ValueError, match="lengths differ"):
    code.score(["a"], [], CFG)


def test_comparisons():
  assert code.lines_match("1  2\r\n3\n\n", "1 2\n3")
  assert not code.lines_match("1 2 3", "1 2\n3")
  assert code.lines_match("0.50000001", "0.5", 1e-6) and not code.lines_match("0.50000001", "0.5")
  assert code.values_match([1, [2.0]], [1, [2]]) and not code.values_match(True, 1)
  assert code.values_match(5, [5]) and not code.values_match([5, 5], [5])
