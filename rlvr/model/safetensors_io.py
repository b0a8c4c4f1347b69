"""Minimal safetensors reader/writer on numpy memmaps (bf16 via ml_dtypes).

The `safetensors` package's numpy backend has no bfloat16, and its torch/flax
backends would load whole files; this reads one tensor at a time from a memmap.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np

from rlvr.common import fileio

_DTYPES = {
  "F64": np.float64,
  "F32": np.float32,
  "F16": np.float16,
  "BF16": ml_dtypes.bfloat16,
  "I64": np.int64,
  "I32": np.int32,
  "I16": np.int16,
  "I8": np.int8,
  "U8": np.uint8,
  "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class SafetensorsFile:
  """Lazy view of one .safetensors file: `keys()`, `shape(key)`, `get(key)`."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      (n,) = struct.unpack("<Q", f.read(8))
      self._header = json.loads(f.read(n))
    self._header.pop("__metadata__", None)
    self._data_start = 8 + n
    self._mm = None

  def keys(self):
    return self._header.keys()

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self._header[key]["shape"])

  def get(self, key: str) -> np.ndarray:
    info = self._header[key]
    if info["dtype"] not in _DTYPES:
      raise ValueError(f"{self.path}: tensor {key!r} has unsupported dtype {info['dtype']}")
    if self._mm is None:
      self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    start, end = info["data_offsets"]
    raw = self._mm[self._data_start + start : self._data_start + end]
    return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict | None = None) -> None:
  """Writes tensors (numpy, any supported dtype) in safetensors layout."""
  header, offset = {}, 0
  arrays = {}
  for key, arr in tensors.items():
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in _NAMES:
      raise ValueError(f"tensor {key!r}: dtype {arr.dtype} cannot be written to safetensors")
    header[key] = {
      "dtype": _NAMES[arr.dtype],
      "shape": list(arr.shape),
      "data_offsets": [offset, offset + arr.nbytes],
    }
    offset += arr.nbytes
    arrays[key] = arr
  header["__metadata__"] = {"format": "pt", **(metadata or {})}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with fileio.atomic_open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays.values():
      f.write(arr.tobytes())
