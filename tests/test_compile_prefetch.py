"""A setting's programs are loaded from the compilation cache ahead of their lookup
(trainer/compile_prefetch.py): the next start of a setting gets the executable JAX would have read,
and only that one; a wrong guess or a damaged index is JAX's own read, as before.

One process of its own (JAX's cache folder is chosen once per process), with JAX caching every
program (its minimum compile time 0)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from trainer import compile_prefetch as cp

SCRIPT = r"""
import base64, json, pathlib, sys
import jax, jax.numpy as jnp
from jax._src.lib import xla_client
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from trainer import compile_cache, compile_prefetch as cp
folder = compile_cache.enable(sys.argv[1])
out = {}
f = lambda x: jnp.sin(x) * 2 + x.sum()
x = jnp.arange(8.0)
def run():
  jax.clear_caches()  # a new start: nothing in this process's memory
  return jax.jit(f).lower(x).compile()(x).tolist()
out["none_yet"] = cp.start(folder, "s")
first = run()
cp.remember(folder, "s")
out["first"] = cp.finish()
out["other_setting"] = cp.start(folder, "t")
cp.finish()
out["started"] = cp.start(folder, "s")
out["loading"] = [cp.loading("jit__lambda"), cp.loading("jit_g")]
out["same"] = run() == first
out["taken"] = [cp.taken("jit__lambda"), cp.taken("jit_g")]
out["second"] = cp.finish()
out["left_out"] = cp.start(folder, "s", leave=("jit__lambda",))  # JAX's name for f's program
def g(x):
  return jnp.cos(x) - 1
jax.jit(g).lower(x).compile()  # this run asks for g's program only
cp.remember(folder, "s")
cp.finish()
index = pathlib.Path(folder) / "axtrain-prefetch" / "s.json"
out["programs"] = sorted(e["key"].rsplit("-", 1)[0]
                         for e in json.loads(index.read_text())["programs"])
entries = json.loads(index.read_text())
for e in entries["programs"]:  # a guess for other compile options: loaded, not handed over
  e["options"] = base64.b64encode(xla_client.CompileOptions().SerializeAsString()).decode()
index.write_text(json.dumps(entries))
out["wrong_started"] = cp.start(folder, "s")
out["wrong_same"] = run() == first
out["wrong_taken"] = cp.taken("jit__lambda")
out["wrong"] = cp.finish()
index.write_text("{not json")
out["damaged_started"] = cp.start(folder, "s")
out["damaged_same"] = run() == first
out["damaged"] = cp.finish()
print(json.dumps(out))
"""


def test_the_next_start_takes_the_executable_loaded_ahead_and_only_the_right_one(tmp_path):
  done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cache")], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["none_yet"] == 0 and out["first"]["programs_loaded_ahead"] == 0
  assert out["other_setting"] == 0  # another setting's index: nothing to load
  assert out["started"] >= 1 and out["same"]
  assert out["second"]["programs_loaded_ahead"] == 1, out
  assert out["loading"] == [True, False] and out["taken"] == [True, False]
  assert out["second"]["loads_not_taken"] == out["started"] - 1
  assert out["left_out"] == 0  # a program left out (a resume's initialisation) is not loaded
  assert out["programs"] == ["jit__lambda", "jit_g"]  # a run asking for g keeps f's entry
  assert out["wrong_started"] >= 1 and out["wrong_same"]
  assert out["wrong"]["programs_loaded_ahead"] == 0, out  # JAX read it itself
  assert not out["wrong_taken"]
  assert out["damaged_started"] == 0 and out["damaged_same"]
  assert out["damaged"]["programs_loaded_ahead"] == 0


def test_the_programs_a_start_needs_first_are_loaded_first():
  """One load at a time (on one v5e side by side loads only made the first-needed one late):
  the order is the start's, then the index's."""
  entries = [{"key": f"{name}-{i}"} for i, name in
             enumerate(["jit_eval_step", "jit_stage", "jit_initial_state", "jit_train_step"])]
  ranked = cp._ranked  # pylint: disable=protected-access
  def order(first):
    return [e["key"].rsplit("-", 1)[0] for e in ranked(entries, first)]
  assert order(("jit_initial_state", "jit_train_step", "jit_eval_step")) == [
      "jit_initial_state", "jit_train_step", "jit_eval_step", "jit_stage"]
  assert order(("jit_train_step", "jit_eval_step")) == [
      "jit_train_step", "jit_eval_step", "jit_stage", "jit_initial_state"]
  assert order(()) == [e["key"].rsplit("-", 1)[0] for e in entries]
  assert ranked([*entries, "not an entry"], ())[-1] == "not an entry"
