"""`nccl` (GPU): the trainer's JAX arrays broadcast over NCCL into vLLM's built-in engine.

Not run by the test suite (it needs GPUs); written against vLLM 0.32's dense NCCL engine
(`vllm/distributed/weight_transfer/nccl_engine.py`), driven the way its own trainer
engine and TRL's client drive it: this process is rank 0 of a `StatelessProcessGroup`
(TCPStore at `master_address:master_port`) whose other ranks are the server's workers
(`rank_offset` 1), and one `/update_weights` per bucket runs while the bucket's tensors
are broadcast one by one (unpacked). The trainer's environment needs torch with CUDA and
vLLM itself (its `PyNcclCommunicator`).

Tensors never leave the GPU: `hf_arrays` gathers each HF tensor from its mesh shards onto
this host's first device (laid out and cast there), and DLPack hands it to torch. Every
process of a multi-host run iterates the same tensors in the same order (the gathers are
collectives) and feeds its own servers.
"""

from __future__ import annotations

from rlvr.sampling.vllm_server import free_port
from rlvr.sampling.weights import TransferError, hf_arrays, torch_dtype_name


class NcclTransport:
  """`nccl`: rank 0 of an NCCL group with the server's workers; broadcasts each tensor."""

  backend = "nccl"
  atomic = False  # vLLM's NCCL engine loads each bucket as it arrives

  def __init__(self, host: str = "127.0.0.1", timeout_s: float = 300.0):
    self.host, self.timeout_s = host, timeout_s
    self._group = None
    self._rendezvous: dict | None = None

  def open(self, world_size: int) -> dict:
    self.close()
    self._rendezvous = {
      "master_address": self.host,
      "master_port": free_port(self.host),
      "world_size": world_size + 1,
    }
    return dict(self._rendezvous, rank_offset=1, packed=False)

  def connect(self) -> None:
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    assert self._rendezvous is not None, "open() first"
    try:
      self._group = trainer_init(self._rendezvous, rank=0)
    except Exception as e:  # NCCL / TCPStore errors are not OSErrors
      raise TransferError(f"nccl rendezvous: {type(e).__name__}: {e}") from None

  def tensors(self, config, params, dtype):
    import torch.utils.dlpack

    for name, x in hf_arrays(config, params, dtype):
      yield name, torch.utils.dlpack.from_dlpack(x)

  def update_info(self, version, bucket, tensors, last):
    del version, bucket, last  # NCCLWeightTransferUpdateInfo carries the metadata only
    return {
      "names": [n for n, _ in tensors],
      "dtype_names": [torch_dtype_name(t.dtype) for _, t in tensors],
      "shapes": [list(t.shape) for _, t in tensors],
    }

  def send(self, version, bucket, tensors):
    import torch

    stream = torch.cuda.current_stream()
    try:
      for _, t in tensors:
        self._group.broadcast(t.contiguous(), src=0, stream=stream)
      stream.synchronize()
    except Exception as e:
      raise TransferError(f"nccl broadcast of bucket {bucket}: {type(e).__name__}: {e}") from None

  def close(self) -> None:
    if self._group is not None:
      try:
        self._group.destroy()
      finally:
        self._group = None
