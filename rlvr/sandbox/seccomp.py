"""What the sandboxed judge does to itself ahead of any program: `hardening`.

The judge joins a fresh anonymous session keyring (the host's session keyring, and the keys
in it, are not the sandbox's) and then installs a seccomp filter, built here as classic BPF
for x86-64 (`syscall_filter`): it refuses keyctl, add_key, request_key, ptrace,
process_vm_*, the mount and namespace calls (clone with a namespace flag included), mq_open,
bpf, perf_event_open, userfaultfd, io_uring, modules, kexec, reboot, swap and a few more
(`BLOCKED_SYSCALLS`), and kills a process that enters through the i386 or x32 ABI. On other
machines there is no filter (a logged warning), and the other bounds stay.

The judge's uid (`judge_user`). A root host cannot give bubblewrap a user namespace whose uid 0
is someone else (bubblewrap maps the sandbox's one uid to the caller's, and run as nobody it
cannot bind an interpreter under a root-only directory such as /root/.pyenv). So as root
bubblewrap runs without a user namespace, keeping only CAP_SETUID and CAP_SETGID, and the judge
drops to uid and gid 65534 (`NOBODY`) ahead of reading a program: every file of the host the
sandbox can reach is then the host's nobody's to touch. That needs the syscall filter to refuse
new user namespaces (bubblewrap's --disable-userns needs a user namespace of its own), so
without the filter (not x86-64), or where bubblewrap cannot run as real root (a container
without CAP_SYS_ADMIN: the sandbox's start-up probe finds it and says so with
`keep_user_namespace`), a root host keeps the user namespace whose uid 0 is the host's root,
without capabilities (logged). A non-root host runs bubblewrap in a user namespace as itself
(--disable-userns).
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct

NOBODY = 65534  # the judge's uid and gid when the host runs as root
# keyctl's system call number (the judge joins a fresh session keyring with it).
_KEYCTL_NR = {"x86_64": 250, "aarch64": 219}
# System calls the judge and the programs never need, refused with EPERM (x86-64 numbers):
# keys, tracing other processes, mounts, new namespaces, POSIX message queues (state of the
# IPC namespace that the judge cannot list to clear between test cases), and kernel interfaces
# with a history of exploits (BPF, perf, userfaultfd, io_uring), modules, kexec, reboot, swap.
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
  "mq_open": 240,
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


def keep_user_namespace(keep: bool = True) -> None:
  """Whether `judge_user` answers None whatever the host (bubblewrap in a user namespace, the
  judge as its uid 0); False returns it to deciding by the host."""
  _judge_uid[:] = [None] if keep else []


def hardening() -> dict:
  """What the sandboxed judge does first (`driver._harden`): join a fresh session keyring
  (`keyctl`: the system call number), drop to `uid`, install the `seccomp` filter (hex)."""
  bpf = syscall_filter()
  return {
    "keyctl": _KEYCTL_NR.get(platform.machine()),
    "uid": judge_user(),
    "seccomp": None if bpf is None else bpf.hex(),
  }
