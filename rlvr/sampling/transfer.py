"""Weights to vLLM servers through vLLM's RL weight-transfer API (no disk).

A server started with `--weight-transfer-config '{"backend": NAME}'` takes an update as
`/start_weight_update`, one `/update_weights` per bucket (each running while this process
streams that bucket's tensors on the backend's data plane), `/finish_weight_update`
(which records the version) and `/reset_prefix_cache`; then `/weight_info` must report
the pushed version. The rendezvous, `/init_weight_transfer_engine`, is done once per
server and again after any failure.

A `Transport` is the data plane of one backend; `TRANSPORTS` maps backend names to them:

- `rlvr_tcp` (CPU): raw bytes over one TCP connection per server worker, into the
  `rlvr_tcp` engine that `plugins/rlvr_vllm_transfer` registers in vLLM. That engine
  stages the tensors and loads them only once the last bucket is in (`atomic`): the
  server samples on meanwhile, and a broken transfer leaves it on its old weights.
- `nccl` (GPU, `rlvr.sampling.transfer_nccl`): vLLM's built-in NCCL engine loads each
  bucket as it arrives, so the server is paused (`/pause?mode=wait` ... `/resume`)
  around the update, and a broken transfer leaves it paused (never serving a
  half-updated policy) until a later push completes.

Every transport sends the checkpoint an untied `save_hf` would write (a tied model's
embedding also goes out as `lm_head.weight`), in HF names, cast to the sync dtype.
A failed push is retried from a new rendezvous; when the tries run out the error names
the server and the version it reports.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import secrets
import socket
import struct
import types
import urllib.parse
from typing import Any, Callable, Iterable

import numpy as np
import requests

from rlvr.sampling import http
from rlvr.sampling.config import TRANSFER_BACKENDS
from rlvr.sampling.weights import (
  TransferError,
  Transport,
  buckets,
  host_tensors,
  torch_dtype_name,
)


def local_address(url: str) -> str:
  """This host's address on the route to the server at `url` (what its workers dial)."""
  host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((host, 9))  # UDP: no packet is sent, only a route is chosen
    return s.getsockname()[0]


_HEADER = struct.Struct("<8sqqq")  # magic, version, bucket, payload bytes (the engine's)
_MAGIC, _END = b"RLVRWT01", b"RLVRWEND"


class TcpTransport:
  """`rlvr_tcp`: this process listens; each server worker connects and reads raw bytes."""

  backend = "rlvr_tcp"
  atomic = True

  def __init__(self, host: str = "127.0.0.1", timeout_s: float = 300.0):
    self.host, self.timeout_s = host, timeout_s
    self._listener: socket.socket | None = None
    self._conns: list[socket.socket] = []
    self._world = 0
    self._token = ""

  def open(self, world_size: int) -> dict:
    self.close()
    self._listener = socket.create_server((self.host, 0))
    self._listener.settimeout(self.timeout_s)
    self._world, self._token = world_size, secrets.token_hex(16)
    return {
      "master_address": self.host,
      "master_port": self._listener.getsockname()[1],
      "token": self._token,
      "rank_offset": 1,
      "world_size": world_size + 1,
      "timeout_s": self.timeout_s,
    }

  def connect(self) -> None:
    assert self._listener is not None, "open() first"
    while len(self._conns) < self._world:
      conn, _ = self._listener.accept()
      conn.settimeout(self.timeout_s)
      hello = conn.makefile("rb").readline(4096)
      try:
        ok = json.loads(hello).get("token") == self._token
      except ValueError:
        ok = False
      if not ok:
        conn.close()
        continue
      conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      conn.sendall(b"OK\n")
      self._conns.append(conn)

  def tensors(self, config, params, dtype):
    return host_tensors(config, params, dtype)

  def update_info(self, version, bucket, tensors, last):
    return {
      "version": version,
      "bucket": bucket,
      "names": [n for n, _ in tensors],
      "dtype_names": [torch_dtype_name(t.dtype) for _, t in tensors],
      "shapes": [list(t.shape) for _, t in tensors],
      "last": last,
    }

  def send(self, version, bucket, tensors):
    nbytes = sum(int(t.nbytes) for _, t in tensors)
    for conn in self._conns:
      try:
        conn.sendall(_HEADER.pack(_MAGIC, version, bucket, nbytes))
        for _, t in tensors:
          conn.sendall(memoryview(t.reshape(-1).view(np.uint8)))
        conn.sendall(_HEADER.pack(_END, version, bucket, nbytes))
      except OSError as e:
        raise TransferError(f"rlvr_tcp stream: {type(e).__name__}: {e}") from None

  def close(self) -> None:
    for s in self._conns + ([self._listener] if self._listener else []):
      try:
        s.close()
      except OSError:
        pass
    self._conns, self._listener = [], None


def _nccl_transport(**kw) -> Transport:
  return importlib.import_module("rlvr.sampling.transfer_nccl").NcclTransport(**kw)


TRANSPORTS: types.MappingProxyType[str, Callable[..., Transport]] = types.MappingProxyType(
  {"rlvr_tcp": TcpTransport, "nccl": _nccl_transport}
)
assert tuple(TRANSPORTS) == TRANSFER_BACKENDS


def make_transport(backend: str, **kw) -> Transport:
  if backend not in TRANSPORTS:
    raise ValueError(f"transfer_backend: unknown {backend!r}; expected one of {TRANSFER_BACKENDS}")
  return TRANSPORTS[backend](**kw)


# ------------------------------------------------------------------ the pushes
class ServerLink:
  """Pushes weights into one server through one transport; re-rendezvous after failures.

  Its HTTP calls are single tries on fresh connections (vLLM drops a keep-alive
  connection after a route fails, and a retried `/update_weights` would read a stream
  that is already gone): the retries are whole pushes, here.
  """

  def __init__(
    self,
    url: str,
    transport: Transport,
    *,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    bucket_bytes: int = 512 << 20,
    retries: int = 2,
  ):
    self.url, self.transport = url, transport
    self.headers = http.auth_headers(http.resolve_api_key(api_key))
    self.timeout_s, self.bucket_bytes, self.retries = timeout_s, bucket_bytes, retries
    self.ready = False
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wt-rpc")

  def _call(self, method: str, route: str, payload: dict | None = None) -> Any:
    headers = dict(self.headers, Connection="close")
    try:
      r = requests.request(
        method, self.url + route, json=payload, headers=headers, timeout=self.timeout_s
      )
    except requests.RequestException as e:
      raise TransferError(f"{route}: {type(e).__name__}: {http.short_error(e)}") from None
    if r.status_code >= 400:
      raise TransferError(f"{route}: HTTP {r.status_code}: {http.server_message(r)}")
    try:
      return r.json() if r.content else None
    except ValueError:
      raise TransferError(f"{route}: response is not JSON: {r.text[:200]!r}") from None

  def _post(self, route: str, payload: dict | None = None) -> Any:
    return self._call("POST", route, payload or {})

  def reported_version(self) -> str | None:
    """The version the server says it holds (`/weight_info`)."""
    try:
      return self._call("GET", "/weight_info").get("weight_version")
    except (TransferError, AttributeError) as e:
      return f"unknown ({e})"

  def _rendezvous(self) -> None:
    self.ready = False
    world = self._call("GET", "/get_world_size")["world_size"]
    init_info = self.transport.open(int(world))
    fut = self._pool.submit(self._post, "/init_weight_transfer_engine", {"init_info": init_info})
    try:
      self.transport.connect()
    except (OSError, TransferError) as e:
      self.transport.close()  # the server's side fails too, so its RPC returns
      raise TransferError(f"rendezvous: {type(e).__name__}: {e}; server: {_outcome(fut)}") from None
    fut.result()
    self.ready = True

  def _abandon(self) -> None:
    """Drops a failed try: the server's update (if any) ends without loading anything."""
    self.transport.close()
    self.ready = False
    try:  # clears an update the server still holds open; an error is the expected answer
      self._post("/update_weights", {"update_info": {"abort": True}})
    except TransferError:
      pass

  def _push_once(self, tensors: Iterable[tuple[str, Any]], version: int) -> None:
    if not self.ready:
      self._rendezvous()
    if not self.transport.atomic:  # it loads buckets as they come: no sampling meanwhile
      self._post("/pause?mode=wait")
    self._post("/start_weight_update")
    groups = buckets(tensors, self.bucket_bytes)
    group = next(groups, [])
    b = 0
    while group:
      nxt = next(groups, [])
      info = self.transport.update_info(version, b, group, last=not nxt)
      fut = self._pool.submit(self._post, "/update_weights", {"update_info": info})
      try:
        self.transport.send(version, b, group)
      except TransferError as e:
        self.transport.close()  # unblocks the server's read, so the RPC returns
        raise TransferError(f"bucket {b}: {e}; server: {_outcome(fut)}") from None
      except BaseException:
        self.transport.close()
        raise
      fut.result()
      group, b = nxt, b + 1
    self._post("/finish_weight_update", {"weight_version": str(version)})
    self._post("/reset_prefix_cache")
    if not self.transport.atomic:
      self._post("/resume")
    got = self.reported_version()
    if got != str(version):
      raise TransferError(f"pushed version {version}, server reports {got!r}")

  def push(self, make_tensors: Callable[[], Iterable[tuple[str, Any]]], version: int) -> None:
    """Pushes `make_tensors()` (a fresh iteration per try) as `version`, or raises
    TransferError naming the server once `retries + 1` tries have failed."""
    errors = []
    for _ in range(self.retries + 1):
      try:
        self._push_once(make_tensors(), version)
        return
      except TransferError as e:
        errors.append(str(e))
        self._abandon()
      except BaseException:
        self._abandon()
        raise
    held = self.reported_version()
    if self.transport.atomic:
      state = f"it still serves version {held!r} (its weights unchanged)"
    else:
      state = f"it is left paused (it may hold part of the update) and reports version {held!r}"
    raise TransferError(
      f"vLLM server {self.url}: weight transfer ({self.transport.backend}) of version "
      f"{version} failed in {len(errors)} tries ({'; '.join(errors)}); {state}"
    )

  def close(self) -> None:
    self.transport.close()
    self._pool.shutdown(wait=False, cancel_futures=True)


def _outcome(fut: concurrent.futures.Future) -> str:
  """What a route called alongside a failed stream answered."""
  try:
    fut.result()
    return "answered OK"
  except TransferError as e:
    return str(e)
