"""SvS ablations of the paper's Table 3 (docs/methods.md#ablations), as the paper ran them:
Qwen2.5-32B-Instruct on DAPO-17k (configs/svs_dapo17k_qwen25_32b.py), one setting changed each.

  python -m launch.train --config=configs/svs_ablations.py:asp    # + model/data/server flags
  names: asp (underperforming 37.5%..75%), eup (second rollout on underperforming problems,
         no synthesis), naive (R_V = 1 if acc > 0), keep02 (keep 20% of type-2 groups, Appendix
         E.2); tiny_<name> applies the same change to the embedded default (configs/tiny.py).
"""

from configs import svs_dapo17k_qwen25_32b, tiny

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
    raise ValueError(
      f"ablation: unknown {name!r}; expected one of {sorted(ABLATIONS)} (optionally prefixed tiny_)"
    )
  c = tiny.get_config() if embedded else svs_dapo17k_qwen25_32b.get_config()
  c.svs.update(ABLATIONS[key])
  c.workdir = c.workdir + f"_{name}"
  return c
