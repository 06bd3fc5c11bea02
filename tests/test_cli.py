"""The command line: --help, --print_config, overrides, and one-line errors for bad input."""

from __future__ import annotations

import pytest

from launcher import main as main_lib
from tests.conftest import ROOT, cli

pytestmark = pytest.mark.share_experiments  # tests/conftest.py

# The config files of configs/, as a directory's message lists them.
_CONFIG_FILES = sorted(f"configs/{p.name}" for p in (ROOT / "configs").glob("*.py")
                       if "def get_config(" in p.read_text())


def run_main(capsys, *args):
  code = main_lib.main(["axtrain", *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_help_in_a_subprocess():
  result = cli("--help")
  assert result.returncode == 0, result.stderr
  for flag in ("--config", "--output_dir", "--overwrite", "--print_config", "--mesh"):
    assert flag in result.stdout
  assert "axtrain convert" in result.stdout


def test_print_config_is_flat_sorted_and_counts_parameters(capsys):
  code, out, _ = run_main(capsys, "--config=configs/llm_1b.py", "--print_config")
  assert code == 0
  lines = [line for line in out.splitlines() if not line.startswith("#")]
  keys = [line.split(": ", 1)[0] for line in lines]
  assert keys == sorted(keys) and len(keys) == len(set(keys))
  assert "model.dim: 2048" in lines and "model.block.attention.num_kv_heads: 8" in lines
  # LLaMA-3.2-1B: 1,235,814,400 parameters (sum of the tensor sizes in its safetensors).
  assert "# parameters: 1,235,814,400 (1.24B)" in out


def test_overrides_reach_the_built_model(capsys):
  code, out, _ = run_main(capsys, "--config=configs/tiny.py", "--print_config",
                          "--config.model.dim=96", "--config.model.block.attention.num_heads=3",
                          "--config.model.block.attention.num_kv_heads=1",
                          "--config.model.block.ffn.hidden_dim=256")
  assert code == 0
  assert "model.dim: 96" in out
  # Count from the dims: embedding + head 2*256*96; per layer q,o 2*96*96, k,v 2*96*32,
  # gated MLP 3*96*256, two norms 2*96; final norm 96.
  per_layer = 2 * 96 * 96 + 2 * 96 * 32 + 3 * 96 * 256 + 2 * 96
  expected = 2 * 256 * 96 + 4 * per_layer + 96
  assert f"# parameters: {expected:,}" in out


BAD_INPUTS = [
    ([], "--config is required"),
    (["--config=missing.py"], "config file 'missing.py' not found"),
    (["--config=configs/base.py"], "defines no get_config"),
    (["--config=configs/tiny.py:size=1"], "config argument 'size=1': this config takes no "
                                          "argument; drop ':size=1'"),
    (["--config=configs/llama.py:sise=1b"], "unknown key 'sise' (did you mean 'size'?); keys: "
                                            "size"),
    (["--config=configs/tiny.py:oops"], "takes no argument"),
    # A config whose argument has no sensible default asks for it (core/config_args.py:Needed).
    (["--config=configs/llama.py"], "config file 'configs/llama.py': this config needs its "
                                    "argument size (one of test, tiny, 125m, 1b, 3b, 7b, 8b, "
                                    "70b): add :size=VALUE after the file name"),
    (["--config=configs/mistral.py"], "config file 'configs/mistral.py': this config needs its "
                                      "argument size (one of test, tiny, 7b): add :size=VALUE"),
    (["--config=configs/gemma.py"], "config file 'configs/gemma.py': this config needs its "
                                    "argument size (one of 2-test, "),
    (["--config=configs/tiny_mixture.py:weight=0.5"],
     "config file 'configs/tiny_mixture.py:weight=0.5': this config needs its argument path "
     "(your JSON Lines corpus, field text): add :path=VALUE after the file name"),
    (["--config=configs/gpt2.py:oops"], "expected key=value"),
    (["--config=README.md"], "config file 'README.md' is not a Python file: a config is a .py "
                             "file whose get_config(arg=None) returns the config"),
    (["--config.trainer.max_steps=3", "--config=configs/tiny.py"],
     "--config.trainer.max_steps=3 comes before --config=FILE; give --config first, then its "
     "overrides"),
    (["--config=configs/moe_tiny.py", "--config.model.block.ffn.aux_loss_coef=inf"],
     "moe.aux_loss_coef must be a finite number >= 0 (0 = off), got inf"),
    (["--config=configs/tiny.py", "--config.optimizer.learnig_rate=1e-3"],
     "did you mean 'learning_rate'"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=ten"], "expected a value of type int"),
    (["--config=configs/tiny.py", "--config.init.from_run=README.md"],
     "init.from_run=README.md is a file, not a directory; give a run directory of axtrain or of "
     "`axtrain convert`"),
    (["--config=configs/tiny.py", "--config.init.from_run=configs"],
     "init.from_run=configs: no checkpoints/ there; give a run directory of axtrain or of "),
    (["--config=configs/tiny.py", "--config.data.kind=tokens", "--config.data.path=README.md"],
     "data.path 'README.md' is a file, not a directory (data.kind=tokens reads the output "
     "directory of `axtrain tokenize`)"),
    (["--config=configs/tiny.py", "--config.model.kind=decoder"], "registered: decoder_lm"),
    (["--config=configs/tiny.py", "--config.model.block.ffn.kind=mpl"], "did you mean 'mlp'"),
    (["--config=configs/tiny.py", "--config.model.dim=100"], "not divisible by num_heads 6"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=0"], "max_steps must be positive"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=-5"], "max_steps must be positive"),
    (["--config=configs/tiny.py", "--outptu_dir=x"], "did you mean 'output_dir'"),
    (["--config=configs/tiny.py", "train"], "unexpected argument 'train'"),
    (["--config=configs/tiny.py", "--config.model.block.attention.implementation=flash"],
     "not one of chunked, dot_product, pallas_hd64, splash, xla (did you mean 'splash'?)"),
    (["--config=configs/gpt2.py", "--config.data.seq_len=2048"],
     "exceeds the 1024 learned positions; set --config.model.position_embedding.max_length=2048"),
    (["--config=configs/llama.py:size=9b"], "config argument size=9b: unknown"),
    (["--config=configs/tiny.py", "--config.trainer.seed=-1"],
     "trainer.seed must be a whole number in [0, 2**63), got -1"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=100000000000000000000000"],
     "trainer.max_steps must be at most 2,147,483,647 (steps are counted in int32)"),
    (["--config=configs/tiny.py", "--config.trainer.max_steps=100000000000000000000000",
      "--print_config"], "trainer.max_steps must be at most 2,147,483,647"),
    (["--config=configs/tiny.py", "--mesh=tpu-v5e-1"],
     "--mesh=tpu-v5e-1 is a tpu mesh but JAX sees 1 cpu device(s) here; train here with "
     "--mesh=cpu (or --mesh=auto), or plan for that hardware with `axtrain plan --mesh=tpu-v5e-1`"),
    (["--config=configs/tiny.py", "--mesh=tpu"], "--mesh=tpu is a tpu mesh but JAX sees"),
    (["--config=configs/tiny.py", "--mesh=gpu"], "--mesh=gpu is a gpu mesh but JAX sees"),
    (["--config=configs/tiny.py", "--config.model.block.attention.init_std=-0.02"],
     "attention.init_std must be a finite number >= 0, got -0.02"),
    (["--config=configs/tiny.py", "--config.model.block.ffn.init_std=nan"],
     "mlp.init_std must be a finite number >= 0, got nan"),
    (["--config=configs/tiny.py", "--config.model.embedding.init_std=-1"],
     "embedding.init_std must be a finite number >= 0"),
    (["--config=configs/gpt2.py:size=small", "--config.model.position_embedding.init_std=-1"],
     "position_embedding.init_std must be a finite number >= 0"),
    (["--config=configs/moe_tiny.py", "--config.model.block.ffn.init_std=-1"],
     "moe.init_std must be a finite number >= 0"),
    (["--config=configs/tiny.py", "--config.model.block.attention.position.theta=-1"],
     "rope.theta must be a finite number > 0, got -1.0"),
    (["--config=configs/llm_1b.py", "--config.model.block.attention.position.theta=0"],
     "rope_llama3.theta must be a finite number > 0, got 0.0"),
    (["--config=configs/tiny.py", "--config.model.block.norm.eps=-1"],
     "rmsnorm.eps must be a finite number >= 0, got -1.0"),
    (["--config=configs/gpt2.py:size=small", "--config.model.final_norm.eps=inf"],
     "layernorm.eps must be a finite number >= 0, got inf"),
    (["--config=configs/tiny.py", "--config.model.block.attention.head_dim=-8"],
     "attention.head_dim must be positive, or 0 (or None) for dim // num_heads, got -8"),
    (["--config=configs/tiny.py", "--config.model.block.attention.head_dim=0",
      "--config.model.block.attention.num_heads=5", "--config.model.block.attention.num_kv_heads=5"],
     "attention: dim 192 is not divisible by num_heads 5"),
    # A flag without its value, followed by another: absl would take that flag as the value.
    (["--config=configs/tiny.py", "--mesh", "--print_config"],
     "--mesh is given no value (the next argument, --print_config, is a flag); write --mesh=VALUE"),
    (["--config=configs/tiny.py", "--config.data.kind=jsonl", "--config.data.path",
      "--print_config"], "--config.data.path is given no value (the next argument, "
                         "--print_config, is a flag)"),
    # ... a number's field too, which absl parses as it reads the flags (its type error showed
    # the next flag as the value).
    (["--config=configs/tiny.py", "--config.trainer.max_steps", "--config.trainer.max_steps=5"],
     "--config.trainer.max_steps is given no value (the next argument, "
     "--config.trainer.max_steps=5, is a flag); write --config.trainer.max_steps=VALUE"),
    (["--config=configs/tiny.py", "--config.optimizer.learning_rate", "--print_config"],
     "--config.optimizer.learning_rate is given no value (the next argument, --print_config, "
     "is a flag)"),
    (["--config=configs"], "--config=configs: 'configs' is a directory; give a config file; its "
                           f"config files: {', '.join(_CONFIG_FILES[:2])}, "),
    # Ranges name the field and the value, one field at a time.
    (["--config=configs/tiny.py", "--config.eval.batch_size=0"],
     "eval.batch_size: 0 is outside the allowed range [1, inf)"),
    (["--config=configs/tiny.py", "--config.trainer.hang_timeout_s=-1"],
     "trainer.hang_timeout_s: -1.0 is outside the allowed range [0, inf)"),
    (["--config=configs/tiny.py", "--config.checkpoint.keep=0"],
     "checkpoint.keep: 0 is outside the allowed range [1, inf)"),
    (["--config=configs/moe_tiny.py", "--config.model.block.ffn.aux_loss_coef=-1"],
     "moe.aux_loss_coef must be a finite number >= 0 (0 = off), got -1.0"),
    (["--config=configs/llm_1b.py", "--config.model.block.attention.position.factor=0"],
     "rope_llama3.factor must be positive, got 0.0"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, message):
  code, out, err = run_main(capsys, *args, f"--output_dir={tmp_path / 'run'}")
  assert code == 2
  assert err.count("\n") == 1 and err.startswith("axtrain: error: "), err
  assert message in err
  assert not (tmp_path / "run").exists()


CONFIG_FILES = {
    "raises.py": ("def get_config(arg=None):\n  raise RuntimeError('broken on purpose')\n",
                  "config file '{}' line 2: RuntimeError: broken on purpose"),
    "none.py": ("\n\ndef get_config(arg=None):\n  cfg = 1\n",
                "config file '{}' line 3: get_config() returned None, not an "
                "ml_collections.ConfigDict; end it with `return cfg`"),
    "missing.py": ("import no_such_module\n\n\ndef get_config(arg=None):\n  pass\n",
                   "config file '{}' line 1: ModuleNotFoundError: No module named "
                   "'no_such_module'"),
    "reads.py": ("def get_config(arg=None):\n  return open('/nonexistent/axtrain.txt')\n",
                 "config file '{}' line 2: FileNotFoundError: [Errno 2] No such file or "
                 "directory: '/nonexistent/axtrain.txt'"),
}


@pytest.mark.parametrize("name", CONFIG_FILES)
@pytest.mark.parametrize("command", [[], ["plan", "--mesh=tpu-v5e-4"]], ids=["train", "plan"])
def test_a_config_file_that_fails_is_one_line_naming_file_and_line(capsys, tmp_path, name,
                                                                   command):
  text, message = CONFIG_FILES[name]
  path = tmp_path / name
  path.write_text(text)
  out_dir = [] if command else [f"--output_dir={tmp_path / 'run'}"]  # plan has no --output_dir
  code, out, err = run_main(capsys, *command, f"--config={path}", *out_dir)
  assert code == 2 and err == f"axtrain: error: {message.format(path)}\n", err
  assert not (tmp_path / "run").exists()


def test_head_dim_0_is_dim_over_num_heads(capsys):
  """head_dim=0 means what None (the default) means, as its comment and docs/models.md say:
  dim // num_heads, the same parameters; head_dim=64 gives other ones."""
  counts = {}
  for value in ("None", "0", "64"):
    code, out, err = run_main(capsys, "--config=configs/tiny.py", "--print_config",
                              f"--config.model.block.attention.head_dim={value}")
    assert code == 0, err
    counts[value] = next(line for line in out.splitlines() if line.startswith("# parameters"))
  assert counts["0"] == counts["None"] != counts["64"]


@pytest.mark.slow  # a step of splash in Pallas interpret mode (make test-slow)
def test_splash_off_tpu_says_it_runs_in_interpret_mode(capsys, tmp_path):
  """One `axtrain: note:` line: splash is a Pallas TPU kernel, interpreted (slowly) elsewhere."""
  code, _, err = run_main(capsys, "--config=configs/llama.py:size=test", "--noprogress",
                          "--config.model.block.attention.implementation=splash",
                          "--config.data.seq_len=128", "--config.trainer.max_steps=1",
                          "--config.optimizer.schedule.warmup_steps=0",
                          "--config.eval.batch_size=8", "--config.eval.num_batches=1",
                          "--config.trainer.hang_timeout_s=0",  # its watchdog needs a real stderr
                          f"--output_dir={tmp_path / 'run'}")
  assert code == 0, err
  assert err.startswith("axtrain: note: attention.implementation=splash is a TPU kernel: on cpu "
                        "it runs in Pallas interpret mode (slow, for tests); xla or chunked "
                        "attention is fast here\naxtrain: done; "), err
  assert err.count("\n") == 2, err


def test_help_of_distributed_names_the_flags_it_reads(capsys):
  """The options are listed sorted, so --distributed's help names its flags rather than
  pointing at the ones 'above'."""
  with pytest.raises(SystemExit):
    main_lib.main(["axtrain", "--help"])
  [line] = [l for l in capsys.readouterr().out.splitlines() if l.startswith("  --distributed:")]
  assert "above" not in line and all(
      f"--{name}" in line for name in ("coordinator_address", "num_processes", "process_id"))


def test_version(capsys):
  from launcher.run_dir import versions  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as e:
    main_lib.main(["axtrain", "--version"])
  out = capsys.readouterr().out
  assert e.value.code == 0
  assert out == (f"axtrain {versions()['axtrain']} (jax {versions()['jax']}, jaxlib "
                 f"{versions()['jaxlib']}, python {versions()['python']})\n")
  assert "--version" in main_lib.help_text(main_lib._define_flags(["axtrain"]))  # pylint: disable=protected-access


def test_a_backend_this_machine_cannot_start_is_one_line(tmp_path):
  result = cli("--config=configs/tiny.py", f"--output_dir={tmp_path / 'run'}",
               env={"JAX_PLATFORMS": "cuda"})
  assert result.returncode == 2 and result.stderr == (
      "axtrain: error: JAX_PLATFORMS=cuda: JAX cannot start that backend on this machine (none "
      "of its devices is visible); unset JAX_PLATFORMS to use what it has, or set it to cpu\n"), (
          result.stderr[-2000:])
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("config,args,note", [
    ("configs/tiny.py", ["--config.trainer.max_steps=5"],
     "optimizer.schedule.warmup_steps 20 does not fit in trainer.max_steps 5: the warm-up shrinks "
     "to 0 steps (10% of the run)"),
    ("configs/moe_tiny.py", ["--config.trainer.max_steps=5"],
     "optimizer.schedule.warmup_steps 50 does not fit in trainer.max_steps 5: the warm-up shrinks "
     "to 0 steps (10% of the run)"),
    ("configs/tiny.py", ["--config.optimizer.schedule.kind=wsd", "--config.trainer.max_steps=20"],
     "optimizer.schedule.warmup_steps 20 does not fit in trainer.max_steps 20 (16 steps before "
     "wsd's decay): the warm-up shrinks to 2 steps (10% of the run)"),
])
def test_a_run_shorter_than_its_warmup_is_accepted_with_a_note(capsys, config, args, note):
  code, out, err = run_main(capsys, f"--config={config}", *args, "--print_config")
  assert code == 0 and err == f"axtrain: note: {note}\n", err
  assert "trainer.max_steps:" in out


def test_a_mixture_run_shorter_than_its_warmup_is_accepted_with_a_note(capsys, tmp_path):
  import json  # pylint: disable=import-outside-toplevel
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": f"def f(x):\n  return x * {i}\n"}) + "\n"
                            for i in range(300)))
  code, _, err = run_main(capsys, f"--config=configs/tiny_mixture.py:path={corpus}",
                          "--config.trainer.max_steps=5", "--print_config")
  assert code == 0 and err == ("axtrain: note: optimizer.schedule.warmup_steps 50 does not fit in "
                               "trainer.max_steps 5: the warm-up shrinks to 0 steps (10% of the "
                               "run)\n"), err


def test_a_run_shorter_than_its_warmup_trains(capsys, tmp_path):
  code, _, err = run_main(capsys, "--config=configs/llama.py:size=test", "--noprogress",
                          "--config.trainer.max_steps=3", "--config.eval.batch_size=8",
                          "--config.eval.num_batches=1", "--config.data.seq_len=32",
                          "--config.trainer.hang_timeout_s=0",  # its watchdog needs a real stderr
                          f"--output_dir={tmp_path / 'run'}")
  assert code == 0, err
  assert err.startswith("axtrain: note: optimizer.schedule.warmup_steps ")
  # --noprogress leaves out the progress lines, not the run's last line.
  lines = err.splitlines()
  assert len(lines) == 2 and lines[1].startswith("axtrain: done; final eval_loss "), err
  assert lines[1].endswith(f"; run directory {tmp_path / 'run'}"), err
  import json  # pylint: disable=import-outside-toplevel
  import math  # pylint: disable=import-outside-toplevel
  records = map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
  last = [r for r in records if "loss" in r][-1]
  cfg = json.loads((tmp_path / "run" / "config.json").read_text())["optimizer"]
  peak, end = cfg["learning_rate"], cfg["learning_rate"] * cfg["schedule"]["end_ratio"]
  # No warm-up (a tenth of 3 steps); the cosine over the 3 steps, at step 3's update (2 taken).
  assert last["step"] == 3 and last["learning_rate"] == pytest.approx(
      end + (peak - end) * 0.5 * (1 + math.cos(math.pi * 2 / 3)), rel=1e-6)


def test_broken_config_file(capsys, tmp_path):
  bad = tmp_path / "broken.py"
  bad.write_text("def get_config(:\n")
  code, _, err = run_main(capsys, f"--config={bad}")
  assert code == 2 and err.startswith("axtrain: error: ") and "line 1" in err
  raising = tmp_path / "raising.py"
  raising.write_text("def get_config(arg=None):\n  raise ValueError('no such variant')\n")
  code, _, err = run_main(capsys, f"--config={raising}")
  assert code == 2 and "no such variant" in err and err.count("\n") == 1


def test_bad_input_in_a_subprocess_has_no_traceback(tmp_path):
  result = cli("--config=configs/tiny.py", "--config.model.dim=100",
               f"--output_dir={tmp_path / 'run'}")
  assert result.returncode == 2
  assert result.stderr.startswith("axtrain: error: ") and result.stderr.count("\n") == 1
  assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_mixture_weight_outside_0_1_names_the_config_argument(capsys):
  """weight is the config argument the user typed: the refusal names it, not the stdlib
  component's derived weight (1 - weight) that a value above 1 made negative."""
  code, _, err = run_main(capsys, "--config=configs/tiny_mixture.py:path=c.jsonl,weight=1.5",
                          "--print_config")
  assert code == 2 and err == ("axtrain: error: config file 'configs/tiny_mixture.py:path=c.jsonl,"
                               "weight=1.5': config argument weight=1.5: the share of each batch "
                               "drawn from path, in (0, 1)\n"), err


@pytest.mark.parametrize("word,hint", [
    ("evals", " (did you mean 'eval'?)"), ("genrate", " (did you mean 'generate'?)"),
    ("train", " (training takes no command word: axtrain --config=FILE ...)"),
    ("trian", " (training takes no command word: axtrain --config=FILE ...)")])
def test_a_mistyped_command_word_gets_a_hint(capsys, word, hint):
  code, _, err = run_main(capsys, word, "--config=configs/tiny.py")
  assert code == 2 and err == (f"axtrain: error: unexpected argument '{word}'{hint}; flags look "
                               f"like --name=value, commands: convert, tokenize, plan, generate, "
                               f"runs, eval, launch\n"), err


@pytest.mark.parametrize("args,message", [
    (["--confg=configs/tiny.py"], "unknown flag --confg (did you mean 'config'?); see --help"),
    (["--config=configs/tinny.py"],
     "config file 'configs/tinny.py' not found (did you mean 'configs/tiny.py'?)"),
    (["--config=gpt2.py:size=small"], "config file 'gpt2.py' not found (did you mean "
                                      "'configs/gpt2.py'?)"),
    (["--config=configs/zzz.py"], "config file 'configs/zzz.py' not found")])
def test_a_misspelt_config_flag_or_file_gets_a_did_you_mean(capsys, args, message):
  """Run from the repository root (as the README's commands are)."""
  code, _, err = run_main(capsys, *args)
  assert code == 2 and err == f"axtrain: error: {message}\n", err


@pytest.mark.parametrize("flag,hint", [
    ("--max_step=20", "did you mean --config.trainer.max_steps?"),
    ("--trainer.max_steps=20", "did you mean --config.trainer.max_steps?"),
    ("--learning_rate=1e-3", "did you mean --config.optimizer.learning_rate?"),
    ("--batch_size=4", "did you mean one of --config.data.batch_size, --config.eval.batch_size?")])
def test_a_flag_named_like_a_config_field_points_to_it(capsys, flag, hint):
  code, _, err = run_main(capsys, "--config=configs/tiny.py", flag)
  name = flag.split("=")[0]
  assert code == 2 and err == (f"axtrain: error: unknown flag {name} ({hint} config fields are "
                               f"set as --config.<path>); see --help\n"), err


@pytest.mark.parametrize("override,message", [
    ("eval.every_steps=-1", "eval.every_steps: -1 is outside the allowed range [0, inf)"),
    ("eval.num_batches=0", "eval.num_batches: 0 is outside the allowed range [1, inf)"),
    ("checkpoint.every_steps=-5", "checkpoint.every_steps: -5 is outside the allowed range "
                                  "[0, inf)"),
    ("checkpoint.keep=0", "checkpoint.keep: 0 is outside the allowed range [1, inf)")])
def test_a_negative_count_is_refused_naming_the_field_and_value(capsys, override, message):
  code, _, err = run_main(capsys, "--config=configs/tiny.py", f"--config.{override}",
                          "--print_config")
  assert code == 2 and err == f"axtrain: error: {message}\n", err


def test_an_unknown_config_field_is_told_one_way_wherever_it_is(capsys, tmp_path):
  """A plain section, the root, a component of some kind, and a key that a config file sets:
  `unknown field 'K' of WHERE [(kind 'X')] (did you mean ...?); its fields: ...`."""
  bad_file = tmp_path / "bad.py"
  bad_file.write_text("from configs import tiny\n\n\ndef get_config(arg=None):\n"
                      "  cfg = tiny.get_config()\n  cfg.trainer.max_stepz = 3\n  return cfg\n")
  cases = [(["--config=configs/tiny.py", "--config.trainer.max_stepz=3"],
            "--config.trainer.max_stepz: unknown field 'max_stepz' of trainer (did you mean "
            "'max_steps'?); its fields: compile_cache, compute_dtype, "),
           (["--config=configs/tiny.py", "--config.trainr.max_steps=3"],
            "--config.trainr.max_steps: unknown field 'trainr' of the config (did you mean "
            "'trainer'?); its fields: checkpoint, data, eval, init, mesh, model, optimizer, "
            "trainer\n"),
           (["--config=configs/tiny.py", "--config.optimizer.b3=0.1"],
            "--config.optimizer.b3: unknown field 'b3' of optimizer (kind 'adamw'); its fields: "),
           # A field of that name elsewhere in the tree is named by its whole path, first.
           (["--config=configs/tiny.py", "--config.model.num_heads=4"],
            "--config.model.num_heads: unknown field 'num_heads' of model (kind 'decoder_lm') "
            "(did you mean 'model.block.attention.num_heads'?); its fields: block, "),
           (["--config=configs/tiny.py", "--config.optimizer.max_steps=4"],
            "--config.optimizer.max_steps: unknown field 'max_steps' of optimizer (kind 'adamw') "
            "(did you mean 'trainer.max_steps'?); its fields: "),
           (["--config=configs/tiny.py", "--config.model.eps=1e-5"],
            "--config.model.eps: unknown field 'eps' of model (kind 'decoder_lm') (did you mean "
            "one of 'model.final_norm.eps', 'model.block.norm.eps', 'optimizer.eps'?); "),
           # A name that many nodes have points nowhere in particular: the node's own fields.
           (["--config=configs/tiny.py", "--config.trainer.kind=x"],
            "--config.trainer.kind: unknown field 'kind' of trainer; its fields: "),
           (["--config=configs/tiny.py", "--config.model.attention.kind=xla"],
            "--config.model.attention.kind: unknown field 'attention' of model (kind "
            "'decoder_lm') (did you mean 'model.block.attention'?); "),
           ([f"--config={bad_file}"],
            "trainer.max_stepz: unknown field 'max_stepz' of trainer (did you mean "
            "'max_steps'?); its fields: compile_cache, compute_dtype, ")]
  for args, message in cases:
    code, _, err = run_main(capsys, *args, "--print_config")
    assert code == 2 and err.startswith(f"axtrain: error: {message}"), err
