"""Run directories: one per run, never nested; --overwrite touches exactly one run's own files.
Their names, and directories that hold more than a trained run: tests/test_run_dir_names.py,
tests/test_run_dir_kinds.py."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from launcher import main as main_lib, run_dir
from trainer import run_files

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

QUICK = '''
from configs import llama


def get_config(arg=None):
  cfg = llama.get_config("size=test")
  cfg.trainer.max_steps = 1
  cfg.optimizer.schedule.warmup_steps = 0
  cfg.data.seq_len = 32
  cfg.eval.batch_size = 8
  cfg.eval.num_batches = 1
  cfg.trainer.log_every = 1
  cfg.trainer.hang_timeout_s = 0.0  # the watchdog needs a real stderr; capsys has none
  return cfg
'''
# A sweep over seeds: every run compiles the same programs, so the compile cache serves them.
SWEEP = (["--config.trainer.seed=1"], ["--config.trainer.seed=2"])
NAMES = ["base", "trainer.seed=1", "trainer.seed=2"]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  import jax  # pylint: disable=import-outside-toplevel
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {n: getattr(jax.config, n) for n in names}
  jax.config.update(names[0], str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update(names[1], 0.0)
  yield
  for name, value in before.items():
    jax.config.update(name, value)


@pytest.fixture
def quick(tmp_path, monkeypatch, compile_cache):  # pylint: disable=unused-argument
  """A one-step config in tmp_path, run from there (default run directories land in it)."""
  (tmp_path / "quick.py").write_text(QUICK)
  monkeypatch.chdir(tmp_path)
  return tmp_path


def axtrain(capsys, *args) -> tuple[int, str]:
  code = main_lib.main(["axtrain", "--config=quick.py", "--noprogress", *args])
  return code, capsys.readouterr().err


def snapshot(root: pathlib.Path) -> dict:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def completed(tmp_path_factory, compile_cache):  # pylint: disable=unused-argument
  """A completed one-step run of QUICK (tests copy it rather than train again)."""
  root = tmp_path_factory.mktemp("completed")
  (root / "quick.py").write_text(QUICK)
  with pytest.MonkeyPatch.context() as mp:
    mp.chdir(root)
    code = main_lib.main(["axtrain", "--config=quick.py", "--noprogress", "--output_dir=run"])
  assert code == 0
  return root / "run"


def copy_of(run: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
  shutil.copytree(run, to, symlinks=True)
  return to


@pytest.fixture
def copied(completed, tmp_path, monkeypatch) -> pathlib.Path:
  """A copy of the completed run as tmp_path/run, with quick.py, run from tmp_path."""
  shutil.copy(completed.parent / "quick.py", tmp_path / "quick.py")
  monkeypatch.chdir(tmp_path)
  return copy_of(completed, tmp_path / "run")


def test_one_config_one_directory_and_old_names_still_resume(quick, capsys):
  lr = "--config.optimizer.learning_rate="
  code, err = axtrain(capsys, lr + "2e-3")
  assert code == 0, err
  runs = quick / "runs" / "quick"
  assert [p.name for p in runs.iterdir()] == ["optimizer.learning_rate=0.002"]
  for same in ([lr + "0.002"], [lr + "2e-3", "--config.optimizer.kind=adamw"]):
    code, err = axtrain(capsys, *same)
    assert code == 0 and "already completed; nothing to do" in err, err
  assert [p.name for p in runs.iterdir()] == ["optimizer.learning_rate=0.002"]
  # A directory named before values were resolved (from the text as typed) is still found.
  (runs / "optimizer.learning_rate=0.002").rename(runs / "optimizer.learning_rate=2e-3")
  code, err = axtrain(capsys, lr + "2e-3")
  assert code == 0 and f"runs/quick/optimizer.learning_rate=2e-3 already completed" in err, err
  assert [p.name for p in runs.iterdir()] == ["optimizer.learning_rate=2e-3"]


def test_flags_in_two_orders_are_one_run(quick, capsys):
  first = ["--config.trainer.seed=1", "--config.eval.batch_size=4"]
  code, err = axtrain(capsys, *first)
  assert code == 0, err
  runs = [p for p in (quick / "runs" / "quick").iterdir()]
  assert [p.name for p in runs] == ["eval.batch_size=4,trainer.seed=1"]
  code, err = axtrain(capsys, *reversed(first))
  assert code == 0 and "already completed; nothing to do" in err, err
  assert list((quick / "runs" / "quick").iterdir()) == runs


def test_overwrite_replaces_one_run_and_no_other(quick, capsys):
  runs = quick / "runs" / "quick"
  for args in ([], *SWEEP):
    code, err = axtrain(capsys, *args)
    assert code == 0, err
  names = sorted(p.name for p in runs.iterdir())
  assert names == NAMES
  for args, name in zip(([], *SWEEP), NAMES):
    others = {n: snapshot(runs / n) for n in names if n != name}
    before = json.loads((runs / name / "run.json").read_text())
    (runs / name / "metrics.jsonl").write_text('{"step": 0}\n')  # so a rewrite shows
    code, err = axtrain(capsys, *args, "--overwrite")
    assert code == 0, err
    after = json.loads((runs / name / "run.json").read_text())
    assert after["status"] == "completed" and after["first_start_time"] >= before["start_time"]
    assert (runs / name / "metrics.jsonl").read_text().startswith('{"step": 1')
    assert {n: snapshot(runs / n) for n in others} == others, f"--overwrite of {name} touched another run"


# -- --overwrite deletes only what axtrain wrote --------------------------------------------

def refused(capsys, *args) -> str:
  code, err = axtrain(capsys, *args)
  assert code == 2 and err.count("\n") == 1 and err.startswith("axtrain: error: "), err
  assert "pass --overwrite" not in err, err
  return err


def test_overwrite_refuses_files_axtrain_did_not_write(copied, capsys):
  run = copied
  (run / "profile").mkdir()
  mine = {"checkpoints/myweights.bin": "w", "tensorboard/mylog.txt": "t", "profile/notes.md": "n"}
  for name, text in mine.items():
    (run / name).write_text(text)
  before = snapshot(run)
  for extra in (["--overwrite"], ["--overwrite", "--config.trainer.seed=3"]):
    err = refused(capsys, "--output_dir=run", *extra)
    assert ("--overwrite deletes only the files axtrain wrote, and run also holds others "
            "(checkpoints/myweights.bin, profile/notes.md, tensorboard/mylog.txt); move them out "
            "of it or choose another --output_dir") in err
    assert snapshot(run) == before
  # A different config: refused without suggesting --overwrite, which could not delete them.
  err = refused(capsys, "--output_dir=run", "--config.trainer.seed=3")
  assert "holds a run with a different config (trainer.seed 0 -> 3)" in err
  assert "it also holds files that axtrain did not write: checkpoints/myweights.bin" in err
  code, err = axtrain(capsys, "--output_dir=run")
  assert code == 0 and "nothing to do (raise --config.trainer.max_steps to extend it)" in err
  assert snapshot(run) == before
  # Moved out, the rest is axtrain's own: --overwrite starts over.
  for name in mine:
    (run / name).unlink()
  code, err = axtrain(capsys, "--output_dir=run", "--overwrite")
  assert code == 0, err
  assert not (run / "profile").exists()
  manifest = json.loads((run / run_files.MANIFEST).read_text())
  assert {"config.json", "run.json", "metrics.jsonl"} <= set(manifest["files"])
  assert any(f.startswith("tensorboard/events.out.tfevents.") for f in manifest["files"])


@pytest.mark.parametrize("files", [
    {"notes.txt": "keep me", "config.json": "{}"},  # beside a run's names
    {"config.json": '{"mine": 1}'},  # a hand-written config.json
    {"checkpoints/model_epoch3.pt": "another framework's weights"},
    {"config.json": '{"trainer": {"max_steps": 1}}', "run.json": '{"status": "completed"}',
     "metrics.jsonl": '{"step": 1}\n'},  # a run's names, written by something else
], ids=["notes", "config", "checkpoints", "look-alike"])
def test_a_folder_of_other_files_is_never_overwritten(quick, capsys, files):
  out = quick / "mine"
  for name, text in files.items():
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
  before = snapshot(out)
  for extra in ([], ["--overwrite"]):
    err = refused(capsys, f"--output_dir={out}", *extra)
    assert f"{out} holds files that axtrain did not write (" in err
    assert "it is not an axtrain run directory, choose another --output_dir" in err or (
        "it is not a run directory, choose another --output_dir" in err)
    assert snapshot(out) == before


def test_a_run_written_before_manifests_is_overwritten_by_its_layout(copied, capsys):
  run = copied
  (run / run_files.MANIFEST).unlink()
  (run / "tensorboard" / "mylog.txt").write_text("mine")
  before = snapshot(run)
  err = refused(capsys, "--output_dir=run", "--overwrite")
  assert "also holds others (tensorboard/mylog.txt)" in err and snapshot(run) == before
  (run / "tensorboard" / "mylog.txt").unlink()
  # Resumed by this axtrain, it gets a manifest of what its layout shows.
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2")
  assert code == 0, err
  listed = json.loads((run / run_files.MANIFEST).read_text())["files"]
  assert {"config.json", "run.json", "metrics.jsonl"} <= set(listed)
  assert sum(f.startswith("tensorboard/events.out.tfevents.") for f in listed) == 2
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2", "--overwrite")
  assert code == 0, err


def test_an_emptied_manifest_is_the_runs_own_and_written_again(copied, capsys):
  """manifest.json emptied (a crash, a full disk, a user): in a directory whose run.json is
  axtrain's it is still the run's own, not a foreign file to 'move out'; the run resumes with a
  note and a manifest rebuilt from its layout (compiler.log recognised by its heading), and
  --overwrite deletes what that layout shows."""
  run = copied
  (run / "compiler.log").write_text(
      "# 2026-12-06T10:00:00+00:00: compiling the train and eval steps\nW0000 a line\n")
  (run / run_files.MANIFEST).write_text("")
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2")
  assert code == 0, err
  assert (f"axtrain: note: {(run / run_files.MANIFEST).absolute()} is empty or damaged: written "
          f"again from the files the run's layout shows to be axtrain's") in err, err
  listed = json.loads((run / run_files.MANIFEST).read_text())["files"]
  assert {"config.json", "run.json", "metrics.jsonl", "compiler.log"} <= set(listed)
  (run / run_files.MANIFEST).write_text("")
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2", "--overwrite")
  assert code == 0, err
  log = run / "compiler.log"  # the old one deleted (a new one only if XLA logs again)
  assert not log.exists() or "W0000 a line" not in log.read_text()


def test_run_files_contents_by_manifest_and_by_layout(completed, tmp_path):
  run = copy_of(completed, tmp_path / "run")
  names = ["checkpoints", "tensorboard", "config.json", "run.json", "metrics.jsonl",
           run_files.MANIFEST]
  found = run_files.contents(run, names)
  assert found.unproven == []
  assert run / "checkpoints" / "1" in found.ours  # an Orbax step proves itself
  (run / run_files.MANIFEST).unlink()
  assert run_files.contents(run, names).unproven == []
  (run / "run.json").write_text('{"status": "completed"}')  # not axtrain's run.json any more
  assert set(run_files.contents(run, names).unproven) >= {"config.json", "run.json",
                                                          "metrics.jsonl"}
  # A damaged step (arrays gone) is still an Orbax folder; a folder without Orbax's metadata
  # is not.
  shutil.rmtree(run / "checkpoints" / "1" / "state")
  assert run / "checkpoints" / "1" in run_files.contents(run, ["checkpoints"]).ours
  (run / "checkpoints" / "1" / "_CHECKPOINT_METADATA").unlink()
  assert run_files.contents(run, ["checkpoints"]).unproven == [
      "checkpoints/1/commit_success.txt", "checkpoints/1/data/commit_success.txt",
      "checkpoints/1/data/metadata"]


# -- folders that are not run directories ----------------------------------------------------

def _fake_run(path: pathlib.Path) -> None:
  path.mkdir(parents=True)
  (path / "config.json").write_text("{}")
  (path / "run.json").write_text(json.dumps({"command": "axtrain --config=x.py",
                                             "versions": {}, "status": "completed"}))
  (path / "checkpoints").mkdir()
  (path / "tensorboard").mkdir()


def test_refusals_say_what_a_folder_is(quick, capsys):
  for name in ("sweep/lr=1", "sweep/lr=2", "runs/tiny/base", "runs/tiny/x=1", "runs/moe/base"):
    _fake_run(quick / name)
  (quick / "tok").mkdir()
  (quick / "tok" / "tokens.json").write_text("{}")
  (quick / "tok" / "shard-00000.tokens.npy").write_text("")
  (quick / "hf").mkdir()
  (quick / "hf" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
  (quick / "hf" / "model.safetensors").write_text("")
  cases = {
      "sweep": "sweep holds 2 runs (lr=1, lr=2); point --output_dir at one of them or at a new "
               "folder",
      "runs": "runs holds 3 runs (moe/base, tiny/base, tiny/x=1); point --output_dir",
      "runs/tiny": "runs/tiny holds 2 runs (base, x=1)",
      "sweep/lr=1/checkpoints": f"--output_dir sweep/lr=1/checkpoints is inside the run directory "
                                f"{quick / 'sweep' / 'lr=1'} (checkpoints/ of that run); runs "
                                f"never nest: give --output_dir={quick / 'sweep' / 'lr=1'}",
      "sweep/lr=1/tensorboard": "is inside the run directory",
      "sweep/lr=1/new": "is inside the run directory",
      "tok": "tok is a tokenized corpus (`axtrain tokenize`); train on it with "
             "--config.data.kind=tokens --config.data.path=tok",
      "hf": "hf is a Hugging Face model (as `axtrain convert --to_hf` writes); to train from it,"
            " `axtrain convert --from_hf=hf --output_dir=NEW_RUN`",
  }
  for out, words in cases.items():
    before = snapshot(quick / out.split("/")[0])
    err = refused(capsys, f"--output_dir={out}", "--overwrite")
    assert words in err, err
    assert snapshot(quick / out.split("/")[0]) == before


def test_a_refusal_is_the_only_line_and_says_what_overwrite_would_delete(copied, capsys):
  """A config whose warm-up does not fit (a note when it runs) refused by the directory: the
  refusal alone, no note before it; its --overwrite names the trained steps it would delete."""
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.seed=3",
                      "--config.optimizer.schedule.warmup_steps=50")
  assert code == 2 and err.count("\n") == 1, err
  assert err.endswith("; choose another --output_dir, or pass --overwrite to delete that run "
                      "(its checkpoints reach step 1) and start this one there\n"), err


def test_a_refused_command_leaves_the_lock_file_alone(copied, capsys):
  run = copied
  (run / ".lock").write_text("12345\n")
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.seed=5")
  assert code == 2 and "holds a run with a different config (trainer.seed 0 -> 5)" in err, err
  assert (run / ".lock").read_text() == "12345\n"


def test_output_dir_empty_or_with_a_tilde(quick, capsys, monkeypatch):
  err = refused(capsys, "--output_dir=")
  assert "--output_dir is empty; give a directory, or leave the flag out" in err
  monkeypatch.setenv("HOME", str(quick / "home"))
  code, err = axtrain(capsys, "--output_dir=~/x")
  assert code == 0, err
  assert (quick / "home" / "x" / "run.json").is_file() and not (quick / "~").exists()


def test_a_run_that_also_holds_a_users_file_is_called_a_run(copied, capsys):
  """A run directory with a file of the user's beside it (a plot, notes) is refused as before,
  but called what it is, with the way to resume it: not "not a run directory", whose advice
  (another --output_dir) would start the run over elsewhere."""
  (copied / "notes.txt").write_text("mine")
  before = snapshot(copied)
  err = refused(capsys, "--output_dir=run", "--config.trainer.max_steps=2")
  assert err == ("axtrain: error: run is a run directory that also holds files axtrain did not "
                 "write (notes.txt); move them out of it to resume, extend or start over this "
                 "run, or choose another --output_dir\n")
  assert snapshot(copied) == before


# -- runs that outlive an upgrade, and runs that grow ----------------------------------------

def test_a_field_added_since_a_run_was_written_is_no_difference(completed, copied, capsys):
  stored = json.loads((completed / "config.json").read_text())
  resolved = json.loads(json.dumps(stored))
  older = json.loads(json.dumps(stored))
  del older["trainer"]["wandb_project"]  # a field this axtrain has and that run's did not
  del older["model"]["block"]["attention"]["position"]  # a whole child node of a default-less kind
  # The node's kind has no default: which position encoding the old run had is unknown.
  assert run_dir.differences(older, resolved) == ["model.block.attention.position.kind"]
  older = json.loads(json.dumps(stored))
  del older["trainer"]["wandb_project"]
  del older["data"]["tokenizer"]  # a child node whose field names a default kind (bytes)
  assert run_dir.differences(older, resolved) == []
  resolved["trainer"]["wandb_project"] = "mine"  # not the default: a real difference
  assert run_dir.differences(older, resolved) == ["trainer.wandb_project"]
  # Through the command line: the old run resumes (here: is complete) with its own command.
  run = copied
  config = json.loads((run / "config.json").read_text())
  del config["trainer"]["wandb_project"], config["trainer"]["peak_flops"]
  (run / "config.json").write_text(json.dumps(config))
  code, err = axtrain(capsys, "--output_dir=run")
  assert code == 0 and "already completed; nothing to do" in err, err


def test_raising_max_steps_extends_a_finished_run(copied, capsys):
  run = copied
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=3")
  assert code == 0, err
  assert ("axtrain: note: extending run from trainer.max_steps 1 to 3, continuing from step 1; "
          "learning-rate schedule warmup_cosine: cosine decay until step 3 (was: cosine decay "
          "until step 1); the learning rate of step 2 is") in err, err
  info = json.loads((run / "run.json").read_text())
  assert info["status"] == "completed" and info["resumed_from_step"] == 1
  assert [{k: e[k] for k in ("from_max_steps", "to_max_steps", "at_step")}
          for e in info["extensions"]] == [{"from_max_steps": 1, "to_max_steps": 3, "at_step": 1}]
  steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
           if "loss" in r]
  assert steps == [1, 2, 3]
  assert json.loads((run / "config.json").read_text())["trainer"]["max_steps"] == 3
  for args, words in ((["--config.trainer.max_steps=2"],
                       "trainer.max_steps 2 is below the run's 3: a run can be extended (raise "
                       "it), not shortened"),
                      (["--config.trainer.max_steps=5", "--config.trainer.seed=4"],
                       "different config (trainer.seed 0 -> 4); ")):  # not the raised max_steps
    code, err = axtrain(capsys, "--output_dir=run", *args)
    assert code == 2 and words in err and "pass --overwrite" in err, err


def test_an_extension_past_an_unreadable_checkpoint_says_where_it_really_continues(copied,
                                                                                    capsys):
  """The newest checkpoint does not read: the run falls back to the one before, and the
  extension's note and run.json name that step and its next step's learning rate."""
  run, every = copied, "--config.checkpoint.every_steps=1"
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=3", every)
  assert code == 0 and "continuing from step 1;" in err, err  # checkpoints 1, 2, 3
  state = run / "checkpoints" / "3" / "state"
  biggest = max((p for p in state.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  with open(biggest, "r+b") as f:
    f.truncate(biggest.stat().st_size // 2)
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=5", every)
  assert code == 0, err
  assert "falling back to step 2" in err, err
  [note] = [line for line in err.splitlines() if "extending run" in line]
  assert "from trainer.max_steps 3 to 5, continuing from step 2;" in note, note
  records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  step3 = [r for r in records if r["step"] == 3 and "loss" in r][-1]  # the resumed run's
  assert f"the learning rate of step 3 is {step3['learning_rate']:.3g} " in note, note
  last = json.loads((run / "run.json").read_text())["extensions"][-1]
  assert {k: last[k] for k in ("from_max_steps", "to_max_steps", "at_step")} == {
      "from_max_steps": 3, "to_max_steps": 5, "at_step": 2}
  assert last["learning_rate"] == pytest.approx(step3["learning_rate"], rel=1e-6)


def test_an_emptied_run_json_is_written_again_with_a_note_naming_what_was_lost(copied, capsys):
  run = copied
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2")  # restarts 1
  assert code == 0, err
  (run / "run.json").write_text("")
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2")
  assert code == 0, err
  [note] = [line for line in err.splitlines() if "run.json is empty" in line]
  assert note.startswith(f"axtrain: note: {pathlib.Path('run') / 'run.json'} is empty: written "
                         f"again; lost with it: first_start_time, restarts, extensions "), note
  info = json.loads((run / "run.json").read_text())
  assert info["status"] == "completed" and info["restarts"] == 0
  assert info["rebuilt"]["reason"] == "run.json is empty"
  assert info["rebuilt"]["lost"] == ["first_start_time", "restarts", "extensions"]


def test_a_damaged_config_json_keeps_its_checkpoints_by_rewrite_config(copied, capsys):
  """A corrupt config.json beside good checkpoints: the refusal names the way that keeps them,
  which resumes them once they fit this command's model, and refuses a model they do not fit."""
  run = copied
  (run / "config.json").write_text("{not json")
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2")
  assert code == 2 and err.count("\n") == 1, err
  assert "its checkpoints (steps 1) are intact: to resume them, run this command with " \
      "--rewrite_config" in err and "--overwrite to start the run over, deleting them" in err, err
  before = snapshot(run)
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2",
                      "--config.model.dim=32", "--rewrite_config")
  assert code == 2 and "--rewrite_config: parameter params." in err, err
  assert snapshot(run) == before  # refused before anything was written
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2",
                      "--rewrite_config")
  assert code == 0 and "config.json was missing or not valid JSON: written again" in err, err
  assert json.loads((run / "config.json").read_text())["trainer"]["max_steps"] == 2
  info = json.loads((run / "run.json").read_text())
  assert info["status"] == "completed" and info["resumed_from_step"] == 1
  code, err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2",
                      "--rewrite_config")
  assert code == 2 and "is fine; drop the flag" in err, err


def test_init_from_run_across_scanned_and_unrolled_layers_names_scan_layers(completed, quick,
                                                                            capsys):
  """The test model unrolls its layers (QUICK): a scanned model from its checkpoint is told
  which model.scan_layers reads it."""
  code, err = axtrain(capsys, f"--config.init.from_run={completed}",
                      "--config.model.scan_layers=true")
  assert code == 2 and err == (
      f"axtrain: error: init.from_run={completed}: the checkpoint ({completed / 'checkpoints'/ '1'})"
      f" holds its layers unrolled (one set of arrays per layer), and this model's are the other "
      f"way; set --config.model.scan_layers=false to read it\n"), err


# -- what a run is: not its mesh, not its length -----------------------------------------------

def test_the_same_run_on_another_mesh_resumes_with_a_note(copied, capsys):
  code, err = axtrain(capsys, "--output_dir=run", "--config.mesh.data=1")
  assert code == 0 and "run already completed; nothing to do" in err, err
  code, err = axtrain(capsys, "--output_dir=run", "--config.mesh.data=1",
                      "--config.trainer.grad_accum_steps=2", "--config.trainer.max_steps=2")
  assert code == 0, err
  assert ("axtrain: note: run continues with mesh.data unset -> 1, trainer.grad_accum_steps 1 -> "
          "2 (where and how its steps run and are recorded, not what they compute: the same "
          "run)") in err, err
  assert "extending run from trainer.max_steps 1 to 2" in err
  stored = json.loads((copied / "config.json").read_text())
  assert stored["mesh"]["data"] == 1 and stored["trainer"]["grad_accum_steps"] == 2
  # A field that changes what the steps compute is another run: refused, as before.
  err = axtrain(capsys, "--output_dir=run", "--config.trainer.max_steps=2",
                "--config.trainer.seed=9")[1]
  # trainer.max_steps, raised (which alone extends a run), is not among the differences.
  assert "holds a run with a different config (trainer.seed 0 -> 9); choose another" in err
  # Another model, by another config file: said so, with the file that trained the run.
  model = json.loads((copied / "config.json").read_text())["model"]
  (copied.parent / "wider.py").write_text(QUICK.replace(
      "  return cfg", f"  cfg.model.dim = {2 * model['dim']}\n"
                     f"  cfg.model.num_layers = {model['num_layers'] + 1}\n  return cfg"))
  assert main_lib.main(["axtrain", "--config=wider.py", "--output_dir=run"]) == 2
  assert capsys.readouterr().err.startswith(
      f"axtrain: error: run holds a run of another model (trained with --config=quick.py: "
      f"model.dim {model['dim']} -> {2 * model['dim']}, model.num_layers {model['num_layers']} -> "
      f"{model['num_layers'] + 1}")
