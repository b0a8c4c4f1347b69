"""Worker side of `rlvr_tcp`: checkpoint tensors streamed from the trainer over TCP.

Handshake (`/init_weight_transfer_engine`): the trainer listens on
`master_address:master_port`; each worker connects, sends one JSON line
`{"token", "rank"}` and waits for `OK\\n`.

One update is `/start_weight_update`, one `/update_weights` per bucket, then
`/finish_weight_update`. For bucket `b` of version `v` the trainer sends a header
`(MAGIC, v, b, nbytes)`, the tensors' raw bytes in `names` order, and a trailer
`(END, v, b, nbytes)`. Tensors are staged in host memory; `finish_weight_update`
loads them into the model (vLLM's layerwise reload, as its NCCL engine does) only
when the bucket marked `last` has arrived, so a transfer that breaks midway (a
short read, a timeout, a wrong header, an `abort` bucket) leaves the served
weights untouched. Any failure drops the staged tensors and the connection; the
trainer then starts again with a new handshake.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
  WeightTransferEngine,
  WeightTransferInitInfo,
  WeightTransferUpdateInfo,
)

from rlvr_vllm_transfer import cpu_moe

HEADER = struct.Struct("<8sqqq")  # magic, version, bucket, payload bytes
MAGIC, END = b"RLVRWT01", b"RLVRWEND"


@dataclasses.dataclass
class TcpInitInfo(WeightTransferInitInfo):
  master_address: str
  master_port: int
  token: str = ""
  rank_offset: int = 1
  world_size: int = 2
  timeout_s: float = 300.0  # longest wait for any byte of the stream


@dataclasses.dataclass
class TcpUpdateInfo(WeightTransferUpdateInfo):
  version: int
  bucket: int
  names: list[str]
  dtype_names: list[str]
  shapes: list[list[int]]
  last: bool = False
  abort: bool = False

  def __post_init__(self):
    if not len(self.names) == len(self.dtype_names) == len(self.shapes):
      raise ValueError("names, dtype_names and shapes differ in length")


class TransferBroken(RuntimeError):
  """The stream ended, stalled or disagreed with the update info."""


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
  got = 0
  while got < len(view):
    n = sock.recv_into(view[got:])
    if n == 0:
      raise TransferBroken(f"trainer closed the connection after {got} of {len(view)} bytes")
    got += n


def _read_header(sock: socket.socket, magic: bytes, version: int, bucket: int, nbytes: int):
  raw = bytearray(HEADER.size)
  _recv_exact(sock, memoryview(raw))
  got = HEADER.unpack(raw)
  if got != (magic, version, bucket, nbytes):
    raise TransferBroken(f"expected {(magic, version, bucket, nbytes)} on the stream, got {got}")


class TcpWeightTransferEngine(WeightTransferEngine[TcpInitInfo, TcpUpdateInfo]):
  init_info_cls = TcpInitInfo
  update_info_cls = TcpUpdateInfo
  supports_draft_weight_update = False

  def __init__(self, config, vllm_config, device, model) -> None:
    super().__init__(config, vllm_config, device, model)
    cpu_moe.install()  # done by register() already; idempotent
    self._sock: socket.socket | None = None
    self._reset_staging()

  def _reset_staging(self) -> None:
    self._staged: list[tuple[str, torch.Tensor]] = []
    self._version: int | None = None
    self._next_bucket = 0
    self._complete = False

  def _rank(self, info: TcpInitInfo) -> int:
    pc = self.parallel_config
    return pc.data_parallel_index * pc.world_size + pc.rank + info.rank_offset

  def init_transfer_engine(self, init_info: TcpInitInfo) -> None:
    self.shutdown()
    sock = socket.create_connection(
      (init_info.master_address, init_info.master_port), timeout=init_info.timeout_s
    )
    try:
      sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      hello = {"token": init_info.token, "rank": self._rank(init_info)}
      sock.sendall(json.dumps(hello).encode() + b"\n")
      ack = bytearray(3)
      _recv_exact(sock, memoryview(ack))
      if bytes(ack) != b"OK\n":
        raise TransferBroken(f"trainer refused the handshake: {bytes(ack)!r}")
    except BaseException:
      sock.close()
      raise
    self._sock = sock

  def start_weight_update(self) -> None:
    self._reset_staging()

  def update_weights(self, update_info: dict[str, Any]) -> None:
    try:
      info = self.parse_update_info(update_info)
      if info.abort:
        raise TransferBroken("update aborted by the trainer; served weights unchanged")
      self.receive_weights(info)
    except BaseException:
      self._reset_staging()
      self.shutdown()  # the stream's position is unknown: a new handshake is needed
      raise

  def receive_weights(self, info: TcpUpdateInfo) -> None:
    if self._sock is None:
      raise TransferBroken("no trainer connection: call /init_weight_transfer_engine first")
    if self._complete:
      raise TransferBroken("bucket after the last one")
    if self._version is not None and info.version != self._version:
      raise TransferBroken(f"bucket of version {info.version} inside version {self._version}")
    if info.bucket != self._next_bucket:
      raise TransferBroken(f"expected bucket {self._next_bucket}, got {info.bucket}")
    tensors = [
      torch.empty(shape, dtype=getattr(torch, dt))
      for dt, shape in zip(info.dtype_names, info.shapes)
    ]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    _read_header(self._sock, MAGIC, info.version, info.bucket, nbytes)
    for t in tensors:
      if t.numel():
        _recv_exact(self._sock, memoryview(t.view(-1).view(torch.uint8).numpy()))
    _read_header(self._sock, END, info.version, info.bucket, nbytes)
    self._staged.extend(zip(info.names, tensors))
    self._version = info.version
    self._next_bucket += 1
    self._complete = info.last

  def finish_weight_update(self) -> None:
    from vllm.model_executor.model_loader.reload import (
      finalize_layerwise_reload,
      initialize_layerwise_reload,
    )

    try:
      if not self._complete:
        raise TransferBroken(
          f"finish before the last bucket ({self._next_bucket} received); served weights unchanged"
        )
      staged = self._staged
      initialize_layerwise_reload(self.model)
      self.model.load_weights(iter(staged))
      finalize_layerwise_reload(self.model, self.model_config)
    finally:
      self._reset_staging()

  def shutdown(self) -> None:
    if self._sock is not None:
      try:
        self._sock.close()
      finally:
        self._sock = None
