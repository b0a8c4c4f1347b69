"""SvS selection and reward rules at every boundary; problem extraction; buffer assembly."""

from __future__ import annotations

import random

import pytest

from synthesis import svs

G = 8
ACCS = {k: k / G for k in (0, 1, 4, 5, 6, 8)}


@pytest.mark.parametrize(
  "k,expected", [(0, False), (1, True), (4, True), (5, False), (6, False), (8, False)]
)
def test_underperforming_band(k, expected):
  assert svs.underperforming(ACCS[k]) is expected


@pytest.mark.parametrize("k,expected", [(0, 0.0), (1, 1.0), (4, 1.0), (5, 1.0), (6, 0.0), (8, 0.0)])
def test_synthesis_reward_band(k, expected):
  assert svs.synthesis_reward(ACCS[k]) == expected


@pytest.mark.parametrize("k,expected", [(0, 0.0), (1, 1.0), (5, 1.0), (8, 1.0)])
def test_naive_reward_rewards_any_solve(k, expected):
  assert svs.synthesis_reward(ACCS[k], naive=True) == expected


def test_asp_band():
  cfg = svs.SvSConfig(under_lo=0.375, under_hi=0.75)
  assert [svs.underperforming(k / 8, cfg.under_lo, cfg.under_hi) for k in range(9)] == [
    False,
    False,
    False,
    True,
    True,
    True,
    True,
    False,
    False,
  ]


def test_synthesis_prompt_shows_the_solution_and_asks_for_a_text_fence():
  p = svs.build_synthesis_prompt("  3*4=12. \\boxed{12}  ")
  assert "<response>\n3*4=12. \\boxed{12}\n</response>" in p
  assert "```text" in p


@pytest.mark.parametrize(
  "text,expected",
  [
    ("Topic: sums.\n```text\nWhat is 2+3?\n```", "What is 2+3?"),
    (
      "<think>draft ```text\nnot this\n```</think>Final:\n```text\nCompute 7*6.\n```",
      "Compute 7*6.",
    ),
    ("no fence here", None),
    ("```\nPlain fence problem.\n```\n```text\nText fence wins.\n```", "Text fence wins."),
    ("```markdown\nFirst plain fence.\n```\n```python\nsecond\n```", "First plain fence."),
    ("<think>```text\nonly inside thinking\n```</think>nothing after", None),
    ("```text\n\n```", None),
    ("```text\n" + "x" * 5000 + "\n```", None),
  ],
)
def test_extract_problem(text, expected):
  assert svs.extract_problem(text) == expected


def test_synthesis_groups_need_mixed_rewards():
  cfg = svs.SvSConfig()
  rng = random.Random(0)
  # all in band -> all R_V = 1 -> dropped; all unparseable -> all 0 -> dropped
  assert svs.synthesis_rewards([0.25] * 8, cfg, rng) is None
  assert svs.synthesis_rewards([None] * 8, cfg, rng) is None
  rewards = svs.synthesis_rewards([0.25, 1.0, None, 0.0, 0.625, 0.75, 0.125, 0.5], cfg, rng)
  assert rewards == (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0)
  assert [svs.rejection_reason(a, cfg) for a in (None, 0.0, 0.25, 0.75)] == [
    "unparseable",
    "too_hard",
    "accepted",
    "too_easy",
  ]


def test_type2_keep_ratio_subsamples():
  cfg = svs.SvSConfig(type2_keep_ratio=0.2)
  rng = random.Random(1)
  kept = sum(svs.synthesis_rewards([0.25, 1.0] * 4, cfg, rng) is not None for _ in range(1000))
  assert 150 < kept < 250


def test_bad_svs_config_is_named():
  with pytest.raises(ValueError, match="type2_keep_ratio"):
    svs.SvSConfig(type2_keep_ratio=1.5)
  with pytest.raises(ValueError, match="mode"):
    svs.SvSConfig(mode="x")
