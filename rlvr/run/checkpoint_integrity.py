"""Checksum manifests that make every checkpoint verify itself, and the steps set aside
when one does not.

Once orbax has finished writing a step (on every process), process 0 writes
`rlvr_manifest.json` into the step's directory (`checkpoint.save`), the size and BLAKE2b
checksum of each of its files, atomically. A step is restored only if its manifest lists
every file in the step's directory, each inside it and there with that size and checksum;
a step without a manifest (a save that did not finish) does not verify either. The SFT
phase's HF export carries the same manifest (`checkpoint.export_hf`).
`checkpoint.restore_or_init` moves a step that does not verify to
`<dir>/corrupt/<step>-<reason>` (orbax no longer lists it), says so in one line and resumes
from the newest step that verifies; with none left, the run stops with one line saying what
to move.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import sys

import jax
import numpy as np

from rlvr.common import fileio
from rlvr.parallel import distributed

MANIFEST = "rlvr_manifest.json"
CORRUPT = "corrupt"  # where steps that do not verify are moved, under the checkpoint dir
_CHUNK = 1 << 20


class CheckpointError(ValueError):
  """A checkpoint that does not verify, or a checkpoint dir none of whose steps does:
  the message is one line naming the step dir, the file and why."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """Why a step does not verify: `file` (relative to the step dir) and a one-word
  `reason` (unverified, manifest, unlisted, missing, truncated, size, checksum), `detail`
  in words."""

  file: str
  reason: str
  detail: str


def _digest(path: str) -> tuple[int, str]:
  """(bytes, BLAKE2b-256 hex) of a file, read in 1 MiB chunks."""
  h, n = hashlib.blake2b(digest_size=32), 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
      n += len(chunk)
  return n, h.hexdigest()


def _digests(root: str, files: list[str]) -> list[tuple[int, str]]:
  # hashlib releases the GIL on large updates: a few threads read and hash in parallel.
  with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(lambda rel: _digest(os.path.join(root, rel)), files))


def _files(step_dir: str) -> list[str]:
  """Every file under the step dir (relative, sorted) but the manifest and its temporary;
  a link to a folder (which the walk does not enter) counts as a file."""
  out = []
  for root, dirs, names in os.walk(step_dir):
    dirs.sort()
    links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
    for name in sorted(names + links):
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if not rel.startswith(MANIFEST):
        out.append(rel)
  return out


def _inside(root: str, rel: str) -> bool:
  """Whether `rel` names a path under the folder `root`, links resolved."""
  if not rel or os.path.isabs(rel):
    return False
  real = os.path.realpath(root)
  return os.path.realpath(os.path.join(real, rel)).startswith(real + os.sep)


def write_manifest(step_dir: str) -> str:
  """Writes `step_dir`/rlvr_manifest.json: {"format": 1, "hash": "blake2b-256",
  "files": {relative path: {"bytes": n, "blake2b": hex}}} of every file there."""
  files = _files(step_dir)
  sums = _digests(step_dir, files)
  body = {
    "format": 1,
    "hash": "blake2b-256",
    "files": {rel: {"bytes": n, "blake2b": h} for rel, (n, h) in zip(files, sums)},
  }
  path = os.path.join(step_dir, MANIFEST)
  with fileio.atomic_open(path, fsync=True) as f:
    json.dump(body, f, indent=1)
  return path


def verify(step_dir: str) -> Problem | None:
  """None when the step's manifest lists every file in `step_dir`, each entry a path inside
  it (links resolved), and each file is there with its size and checksum; else the first
  problem: no manifest, an unreadable or empty one, an entry outside the folder (never
  read), an unlisted file, then sizes before any file is read, then checksums."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    return Problem(
      MANIFEST,
      "unverified",
      "no manifest (its save did not finish, or an rlvr without checksums wrote it)",
    )
  try:
    with open(path) as f:
      files = json.load(f)["files"]
    expected = [(rel, int(e["bytes"]), str(e["blake2b"])) for rel, e in files.items()]
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return Problem(MANIFEST, "manifest", f"unreadable manifest ({' '.join(str(e).split())})")
  if not expected:
    return Problem(MANIFEST, "manifest", "the manifest lists no files")
  for rel, _, _ in expected:
    if not _inside(step_dir, rel):
      why = "outside the folder (a manifest entry must name a file inside it)"
      return Problem(rel, "manifest", why)
  listed = {os.path.normpath(rel) for rel, _, _ in expected}
  for rel in _files(step_dir):
    if rel not in listed:
      why = "not in the manifest (every file of the folder must be listed)"
      return Problem(rel, "unlisted", why)
  for rel, size, _ in expected:
    full = os.path.join(step_dir, rel)
    if not os.path.isfile(full):
      return Problem(rel, "missing", "missing")
    have = os.path.getsize(full)
    if have != size:
      why = "truncated" if have < size else "size"
      return Problem(rel, why, f"{have} bytes, the manifest says {size} ({why})")
  sums = _digests(step_dir, [rel for rel, _, _ in expected])
  for (rel, _, want), (_, got) in zip(expected, sums):
    if got != want:
      return Problem(rel, "checksum", "contents differ from the manifest (BLAKE2b checksum)")
  return None


def steps(directory: str) -> list[int]:
  """The steps under a checkpoint dir, as orbax names them (an integer directory)."""
  if not os.path.isdir(directory):
    return []
  return sorted(
    int(n)
    for n in os.listdir(directory)
    if n.isdigit() and os.path.isdir(os.path.join(directory, n))
  )


def move_aside(directory: str, name: int | str, problem: Problem) -> str:
  """`directory`/<name> (a step, or the SFT phase's `model`) ->
  `directory`/corrupt/<name>-<reason>[-k], with a note of why."""
  aside = os.path.join(directory, CORRUPT)
  os.makedirs(aside, exist_ok=True)
  dest, k = os.path.join(aside, f"{name}-{problem.reason}"), 1
  while os.path.exists(dest):
    k += 1
    dest = os.path.join(aside, f"{name}-{problem.reason}-{k}")
  os.rename(os.path.join(directory, str(name)), dest)
  with open(os.path.join(dest, "rlvr_corrupt.txt"), "w") as f:
    f.write(f"{problem.file}: {problem.detail}\n")
  return dest


def _newest_verified(directory: str) -> int | None:
  """Process 0's part of `latest_verified`."""
  moved = []
  for step in reversed(steps(directory)):
    step_dir = os.path.join(directory, str(step))
    problem = verify(step_dir)
    if problem is None:
      if moved:
        print(
          f"checkpoint: resuming from {step_dir}, the newest that verifies",
          file=sys.stderr,
          flush=True,
        )
      return step
    dest = move_aside(directory, step, problem)
    moved.append(dest)
    print(
      f"checkpoint {step_dir} does not verify: {problem.file}: {problem.detail}; moved to {dest}",
      file=sys.stderr,
      flush=True,
    )
  aside = os.path.join(directory, CORRUPT)
  if moved or (os.path.isdir(aside) and os.listdir(aside)):
    names = ", ".join(sorted(os.listdir(aside)))
    raise CheckpointError(
      f"no checkpoint under {directory} verifies (set aside in {aside}: {names}); to start "
      f"this phase from scratch move {aside} out of the work dir, or give a new --workdir"
    )
  return None


def latest_verified(directory: str) -> int | None:
  """The newest step under `directory` that verifies, None when there is none and none
  was ever set aside. Steps that do not verify are moved to `directory`/corrupt/ with one
  line each on stderr; a dir whose every step was set aside raises `CheckpointError`.

  Process 0 checks and moves; every process gets its answer."""
  if jax.process_count() == 1:
    return _newest_verified(directory)
  from jax.experimental import multihost_utils

  found, error = -1, None
  if distributed.is_writer():
    try:
      step = _newest_verified(directory)
      found = -1 if step is None else step
    except Exception as e:  # noqa: BLE001 - raised below, after the others know
      found, error = -2, e
  found = int(multihost_utils.broadcast_one_to_all(np.int32(found)))
  if error is not None:
    raise error
  if found == -2:
    raise CheckpointError(
      f"no checkpoint under {directory} verifies (process 0 says which and why)"
    )
  return None if found == -1 else found
