"""Model paths as users write them: an HF directory, or a hub id found through the HF cache.

`resolve("Qwen/Qwen2.5-0.5B-Instruct")` returns the cached snapshot directory
(`huggingface_hub`'s cache, `HF_HOME` / `HF_HUB_CACHE` honoured), downloading it
first unless `HF_HUB_OFFLINE` is set. Everything after this point reads a
directory, so nothing else waits on the network. A path that is neither gives one
line naming the config field.
"""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve(path: str, field: str = "model.path") -> str:
  """The local HF directory of `path` (a directory, or a hub id 'org/name')."""
  path = os.path.expanduser(os.fspath(path))
  if os.path.isdir(path):
    if not os.path.exists(os.path.join(path, "config.json")):
      raise FileNotFoundError(f"{field}: {path} has no config.json; not an HF model directory")
    return path
  if os.path.exists(path) or path.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(path):
    raise FileNotFoundError(f"{field}: no such model directory {path} (nor a hub id org/name)")
  return _from_hub(path, field)


def _from_hub(repo_id: str, field: str) -> str:
  from huggingface_hub import constants, snapshot_download
  from huggingface_hub.errors import LocalEntryNotFoundError

  try:
    return snapshot_download(repo_id, local_files_only=True)
  except LocalEntryNotFoundError:
    if constants.HF_HUB_OFFLINE:
      raise FileNotFoundError(
        f"{field}: hub id {repo_id} is not in the HF cache ({constants.HF_HUB_CACHE}) and "
        "HF_HUB_OFFLINE is set; download it where the hub is reachable "
        f"(huggingface-cli download {repo_id}) or give its directory"
      ) from None
  try:
    return snapshot_download(repo_id, etag_timeout=10)
  except Exception as e:  # noqa: BLE001 - network, auth and missing repos all end here
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise FileNotFoundError(
      f"{field}: could not fetch hub id {repo_id} ({reason}); give a local HF directory instead"
    ) from None
