"""launcher/run_dir.py:differences, what tells a resumed run's config from the stored one: values
are compared as JSON with sorted keys, as config.json is written."""

from __future__ import annotations

from launcher import run_dir


def test_a_mesh_rule_in_another_key_order_is_the_same_rule():
  """config.json sorts a rule's dicts; a recipe's mesh.rules need not: the same rules are no
  difference (every llm_1b resume on the chip printed that it "continues with" its own rules),
  a changed value still is."""
  stored = {"mesh": {"rules": [[{"max_hbm_gb": 20, "platform": "tpu"}, {"model.remat": "full"}]]}}
  recipe = {"mesh": {"rules": [[{"platform": "tpu", "max_hbm_gb": 20}, {"model.remat": "full"}]]}}
  assert run_dir.differences(stored, recipe) == []
  recipe["mesh"]["rules"][0][1]["model.remat"] = "none"
  assert run_dir.differences(stored, recipe) == ["mesh.rules"]
