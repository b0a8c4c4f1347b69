"""SvS ablations (METHODS.md), on top of any SvS config via `--config=...:NAME`:

  python -m launch.train --config=configs/svs_ablations.py:asp      # + model/data flags
  names: naive (R_V = 1 if acc > 0), asp (underperforming 37.5%..75%),
         eup (second rollout on underperforming problems, no synthesis),
         keep02 (keep 20% of type-2 groups), tiny_naive / tiny_eup (embedded scale).
"""

from configs import svs_math12k_qwen25_3b, tiny

ABLATIONS = {
    "naive": {"naive_reward": True},
    "asp": {"under_lo": 0.375, "under_hi": 0.75},
    "eup": {"mode": "eup"},
    "keep02": {"type2_keep_ratio": 0.2},
}


def get_config(name: str = "asp"):
  embedded = name.startswith("tiny_")
  key = name[5:] if embedded else name
  if key not in ABLATIONS:
    raise ValueError(f"ablation: unknown {name!r}; expected one of {sorted(ABLATIONS)} "
                     "(optionally prefixed tiny_)")
  c = tiny.get_config() if embedded else svs_math12k_qwen25_3b.get_config()
  c.svs.update(ABLATIONS[key])
  c.workdir = c.workdir + f"_{name}"
  return c
