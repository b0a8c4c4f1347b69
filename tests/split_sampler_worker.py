"""One process of the two-process ProcessSplitSampler test (see tests/e2e/test_multihost.py).

python split_sampler_worker.py COORDINATOR PROCESS_ID SERVER_URL MODEL_NAME MODEL_DIR OUT
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(coordinator, process_id, url, model_name, model_dir, out):
  from rlvr.model.config import ModelConfig
  from rlvr.parallel import distributed
  from rlvr.sampling import SamplingParams
  from rlvr.sampling.split import ProcessSplitSampler
  from rlvr.sampling.vllm_sampler import VLLMSampler

  distributed.initialize(coordinator, 2, int(process_id))
  cfg = ModelConfig.from_hf(model_dir)
  sampler = ProcessSplitSampler(
    VLLMSampler(url, model_config=cfg, eos_token_id=cfg.eos_token_id, model_name=model_name)
  )
  prompts = json.loads(os.environ["SPLIT_PROMPTS"])
  sp = SamplingParams(n=2, temperature=1.0, max_tokens=12, logprobs=True, seed=7)
  # Sampled in a worker thread while this thread runs device collectives, as a rollout
  # built ahead runs during the update (rl.loop.max_staleness=1): the gather is host-side.
  import concurrent.futures

  import jax.numpy as jnp
  from jax.experimental import multihost_utils

  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    fut = pool.submit(sampler.generate, prompts, sp)
    for _ in range(50):  # the same count on every process
      assert int(multihost_utils.process_allgather(jnp.int32(1)).sum()) == 2
    groups = fut.result()
  assert sampler.overlaps_update
  ids = lambda gs: [[c.token_ids for c in g] for g in gs]
  # Two calls more (the second deletes the first's entries) give the same tokens.
  assert ids(sampler.generate(prompts, sp)) == ids(sampler.generate(prompts, sp)) == ids(groups)
  # A host-side verdict that differs between processes (here: by design) is process 0's
  # everywhere, a verifier's Scored whole with its counts.
  import jax
  import numpy as np

  from rlvr.parallel.distributed import agreed
  from rlvr.rewards.verifiers import Scored

  me = jax.process_index()
  score = agreed(lambda texts: Scored(np.full(len(texts), float(me)), None, {"timeout": me}))
  got = score(["a", "b"])
  assert isinstance(got, Scored) and got[0].tolist() == [0.0, 0.0] and got.counts == {"timeout": 0}
  with open(out, "w") as f:
    json.dump(
      [[[list(c.token_ids), list(c.logprobs), c.text, c.finish_reason] for c in g] for g in groups],
      f,
    )


if __name__ == "__main__":
  main(*sys.argv[1:])
