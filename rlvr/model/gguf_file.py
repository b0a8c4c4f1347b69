"""Reading a GGUF file (llama.cpp's format) without trusting its header.

A GGUF is a header (metadata key/values, then one record per tensor: name, dims, ggml
type, data offset) followed by the aligned tensor data. `gguf.GGUFReader` takes every
count in the header at its word: an array of 2^40 uint8 in a small file keeps it
appending empty reads past the end until memory runs out, and a tensor reaching past
the end turns into a reshape error deep inside it. `GGUFFile` walks the header itself, checks
each count against the bytes left and each tensor's extent against the file and its
neighbours, checks the type of every metadata value this library reads
(`METADATA_TYPES`: a bool where a token id belongs, an integer where the chat template
belongs), and hands the tensor bytes to `gguf.quants.dequantize` (the package's own
dequantization). Every defect is a `GGUFError`: one line naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

# The ggml types read here: floats, the legacy block quants and the k-quants.
SUPPORTED_TYPES = tuple(
  GGMLQuantizationType[name]
  for name in ("F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K".split())
)
# Array elements over all metadata. Tokenizers hold 10^5..10^6 (tokens, types, merges);
# each element costs a Python object, so this bounds the header's memory (~1 GiB).
MAX_METADATA_ITEMS = 1 << 24
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_DEPTH = 2  # arrays of arrays, at most
_U64 = struct.Struct("<Q")
_SCALARS = {
  GGUFValueType.UINT8: np.dtype("<u1"),
  GGUFValueType.INT8: np.dtype("<i1"),
  GGUFValueType.UINT16: np.dtype("<u2"),
  GGUFValueType.INT16: np.dtype("<i2"),
  GGUFValueType.UINT32: np.dtype("<u4"),
  GGUFValueType.INT32: np.dtype("<i4"),
  GGUFValueType.FLOAT32: np.dtype("<f4"),
  GGUFValueType.BOOL: np.dtype("?"),
  GGUFValueType.UINT64: np.dtype("<u8"),
  GGUFValueType.INT64: np.dtype("<i8"),
  GGUFValueType.FLOAT64: np.dtype("<f8"),
}


# The type of each metadata key read outside an architecture's own keys (`rlvr.model.gguf_io`
# checks those), as llama.cpp's converter writes it.
METADATA_TYPES = {
  "general.architecture": "string",
  "general.alignment": "integer",
  "tokenizer.ggml.model": "string",
  "tokenizer.ggml.pre": "string",
  "tokenizer.ggml.tokens": "array of string",
  "tokenizer.ggml.scores": "array of number",
  "tokenizer.ggml.token_type": "array of integer",
  "tokenizer.ggml.merges": "array of string",
  "tokenizer.ggml.precompiled_charsmap": "array of integer",
  "tokenizer.ggml.bos_token_id": "integer",
  "tokenizer.ggml.eos_token_id": "integer",
  "tokenizer.ggml.unknown_token_id": "integer",
  "tokenizer.ggml.padding_token_id": "integer",
  "tokenizer.ggml.add_space_prefix": "bool",
  "tokenizer.ggml.add_bos_token": "bool",
  "tokenizer.ggml.add_eos_token": "bool",
  "tokenizer.chat_template": "string",
}
_IS = {
  "string": lambda v: isinstance(v, str),
  "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
  "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
  "bool": lambda v: isinstance(v, bool),
}


class GGUFError(ValueError):
  """A GGUF file this library cannot read; the message names the file."""


def _kind(value) -> str:
  """What a metadata value is, in `METADATA_TYPES`' words."""
  if isinstance(value, list):
    return f"array of {_kind(value[0])}" if value else "empty array"
  return next((kind for kind in ("bool", "integer", "string") if _IS[kind](value)), "float")


def _an(words: str) -> str:
  return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _has_type(value, kind: str) -> bool:
  item = kind.removeprefix("array of ")
  if item == kind:
    return _IS[kind](value)
  return isinstance(value, list) and all(map(_IS[item], value))


def type_name(qtype: int) -> str:
  try:
    return GGMLQuantizationType(qtype).name
  except ValueError:
    return f"type id {qtype}"


@dataclasses.dataclass(frozen=True)
class Tensor:
  """Where one tensor's bytes are. shape: numpy order (ggml's dims reversed), so a
  linear weight is [out, in] as in HF checkpoints."""

  name: str
  shape: tuple[int, ...]
  qtype: GGMLQuantizationType
  start: int  # byte offset in the file
  nbytes: int


class _Cursor:
  """Reads the header front to back; any read past the end is a `GGUFError`."""

  def __init__(self, buf, path: str):
    self.buf, self.path, self.pos, self.items = buf, path, 0, 0

  def fail(self, what: str):
    raise GGUFError(f"{self.path}: {what}")

  def take(self, n: int) -> int:
    start = self.pos
    if n > len(self.buf) - start:
      self.fail(f"truncated: {n} bytes needed at byte {start}, the file has {len(self.buf)}")
    self.pos += n
    return start

  def unpack(self, fmt: str):
    return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

  def string(self) -> str:
    return self.strings(1)[0]

  def strings(self, n: int) -> list[str]:
    """`n` strings (length-prefixed UTF-8), in one tight loop: tokenizers hold 10^5."""
    buf, pos, end, out = self.buf, self.pos, len(self.buf), []
    try:
      for _ in range(n):
        if pos + 8 > end:
          break
        (k,) = _U64.unpack_from(buf, pos)
        if k > end - pos - 8:
          break
        out.append(bytes(buf[pos + 8 : pos + 8 + k]).decode("utf-8"))
        pos += 8 + k
    except UnicodeDecodeError:
      self.fail(f"a string at byte {pos} is not UTF-8")
    if len(out) < n:
      self.fail(f"truncated: a string at byte {pos} runs past the end ({end} bytes)")
    self.pos = pos
    return out

  def count(self, n: int, min_size: int, what: str) -> int:
    """`n` items of at least `min_size` bytes each must fit in what is left."""
    if n * min_size > len(self.buf) - self.pos:
      self.fail(f"{what}: {n} entries declared, more than the {len(self.buf)}-byte file holds")
    return n

  def value(self, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype == GGUFValueType.STRING:
      return self.string()
    if vtype in _SCALARS:
      dt = _SCALARS[GGUFValueType(vtype)]
      x = np.frombuffer(self.buf, dt, 1, self.take(dt.itemsize))[0]
      # A float32 as the writer spelled it (1e-05, not 9.999999747378752e-06).
      return float(str(x)) if vtype == GGUFValueType.FLOAT32 else x.item()
    if vtype != GGUFValueType.ARRAY or depth >= _MAX_DEPTH:
      self.fail(f"metadata {key!r}: unsupported value type {vtype}")
    itype, n = self.unpack("<I"), self.unpack("<Q")
    if itype in _SCALARS:
      dt = _SCALARS[GGUFValueType(itype)]
      self.count(n, dt.itemsize, f"metadata {key!r}")
      self._add_items(n, key)
      return np.frombuffer(self.buf, dt, n, self.take(n * dt.itemsize)).tolist()
    self.count(n, 8, f"metadata {key!r}")  # a string or an array header: >= 8 bytes
    self._add_items(n, key)
    if itype == GGUFValueType.STRING:
      return self.strings(n)
    return [self.value(itype, key, depth + 1) for _ in range(n)]

  def _add_items(self, n: int, key: str) -> None:
    self.items += n
    if self.items > MAX_METADATA_ITEMS:
      self.fail(f"metadata {key!r}: more than {MAX_METADATA_ITEMS} array entries in all")


class GGUFFile:
  """A checked GGUF header (`metadata`, `tensors` by name) over a read-only map of the
  file; `array(name)` dequantizes one tensor to float32."""

  def __init__(self, path: str):
    self.path = os.fspath(path)
    try:
      with open(self.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
          raise GGUFError(f"{self.path}: truncated: {size} bytes, not a GGUF file")
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
      raise GGUFError(f"{self.path}: cannot read ({e.strerror or e})") from None
    self.size = size
    self.metadata, self.tensors = self._header(_Cursor(self._map, self.path))

  def _header(self, cur: _Cursor) -> tuple[dict[str, Any], dict[str, Tensor]]:
    if bytes(self._map[:4]) != b"GGUF":
      cur.fail("not a GGUF file (no GGUF magic)")
    cur.take(4)
    version = cur.unpack("<I")
    if version not in (2, 3):
      order = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
      cur.fail(f"GGUF version {version}{order} is not supported (2 and 3 are)")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    cur.count(n_kv, 13, "metadata")  # key length, >= 1 key byte, type
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
      key = cur.string()
      if key in metadata:
        cur.fail(f"metadata {key!r} appears twice")
      metadata[key] = cur.value(cur.unpack("<I"), key)
    for key, kind in METADATA_TYPES.items():
      if key in metadata and not _has_type(metadata[key], kind):
        cur.fail(f"metadata {key!r}: {_an(_kind(metadata[key]))}, not {_an(kind)}")
    cur.count(n_tensors, 24, "tensor records")  # name length, dims, type, offset
    records = [self._record(cur) for _ in range(n_tensors)]
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
      cur.fail(f"general.alignment {align!r} is not a power of two")
    data_start = -(-cur.pos // align) * align
    tensors: dict[str, Tensor] = {}
    for name, dims, qtype, offset in records:
      if name in tensors:
        cur.fail(f"tensor {name} appears twice")
      tensors[name] = self._place(name, dims, qtype, data_start + offset, align)
    spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors.values())
    for (_, end, name), (start, _, after) in zip(spans, spans[1:]):
      if end > start:
        cur.fail(f"tensor {name}: its declared shape needs bytes that tensor {after} holds")
    return metadata, tensors

  @staticmethod
  def _record(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    n_dims = cur.unpack("<I")
    if not 1 <= n_dims <= _MAX_DIMS:
      cur.fail(f"tensor {name}: {n_dims} dimensions (1..{_MAX_DIMS} allowed)")
    dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
    return name, dims, cur.unpack("<I"), cur.unpack("<Q")

  def _place(self, name: str, dims: tuple[int, ...], qtype: int, start: int, align: int):
    where = f"{self.path}: tensor {name}"
    if qtype not in SUPPORTED_TYPES:
      supported = ", ".join(t.name for t in SUPPORTED_TYPES)
      raise GGUFError(
        f"{where}: quantization type {type_name(qtype)} is not supported ({supported})"
      )
    qtype = GGMLQuantizationType(qtype)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    shape = tuple(reversed(dims))
    if dims[0] % block:
      raise GGUFError(f"{where}: rows of {dims[0]} are not whole {qtype.name} blocks of {block}")
    nbytes = math.prod(dims) // block * block_bytes
    if start + nbytes > self.size:
      raise GGUFError(
        f"{where}: shape {list(shape)} as {qtype.name} needs {nbytes} bytes at byte {start}, "
        f"past the end of the {self.size}-byte file"
      )
    if start % align:
      raise GGUFError(f"{where}: data offset {start} is not aligned to {align}")
    return Tensor(name, shape, qtype, start, nbytes)

  def raw(self, name: str) -> np.ndarray:
    """The tensor's bytes, [*rows, bytes per row] (no copy)."""
    t = self.tensors[name]
    block, block_bytes = GGML_QUANT_SIZES[t.qtype]
    row = t.shape[-1] // block * block_bytes
    return np.frombuffer(self._map, np.uint8, t.nbytes, t.start).reshape(*t.shape[:-1], row)

  def array(self, name: str) -> np.ndarray:
    """The tensor dequantized to float32, in `shape`."""
    out = dequantize(self.raw(name), self.tensors[name].qtype)
    return np.asarray(out, np.float32).reshape(self.tensors[name].shape)
