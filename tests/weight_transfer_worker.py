"""A trainer process that dies partway through a weight push (SIGKILL, as an OOM kill does).

python tests/weight_transfer_worker.py URL MODEL_DIR VERSION KILL_AT

Pushes the model at MODEL_DIR scaled by 0.5 as VERSION through the `rlvr_tcp` backend,
one tensor per bucket, and kills itself while producing tensor KILL_AT: the server has
staged the buckets before it and holds its update open.
"""

from __future__ import annotations

import os
import signal
import sys

import jax
import numpy as np

from rlvr import model
from rlvr.sampling.transfer import ServerLink, make_transport

SCALE = 0.5


def main(url: str, model_dir: str, version: int, kill_at: int) -> None:
  cfg, params = model.load_hf(model_dir)
  params = jax.tree.map(lambda p: p * SCALE, params)
  link = ServerLink(url, make_transport("rlvr_tcp"), bucket_bytes=1, retries=0)

  def dying():
    for i, item in enumerate(link.transport.tensors(cfg, params, np.float32)):
      if i == kill_at:
        print(f"killing myself at tensor {i}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
      yield item

  link.push(dying, version)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
