"""`pallas_hd64` attention (modules/attn_pallas_hd64.py, its kernels in
modules/attn_pallas_hd64_kernels.py) beyond the registry's shared tests
(tests/test_attention_impls.py, one block of 128 positions): several blocks each way, the block
tables against the dense mask, every GQA arrangement, a mesh, and what it refuses. Off TPU its
kernels run in Pallas interpret mode, so the cases are small."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modules  # noqa: F401  (registers the implementations)
from core.registry import ConfigError
from launcher import main as main_lib
from modules import attn_pallas_hd64 as hd64
from modules import attn_pallas_hd64_kernels as kernels
from modules import masks
from modules.attention import AttentionConfig
from modules.attn_xla import xla_attention
from modules.masks import Mask
from tests import test_attention_impls
from tests.test_modules import against_xla

pytestmark = pytest.mark.usefixtures("highest_precision")


FORMS = sorted(hd64.FORMS)  # attention.pallas_products


def _cfg(heads: int, kv_heads: int, *, bq: int = 128, bkv: int = 128, window=None,
         products: str = "transposed"):
  return AttentionConfig(num_heads=heads, num_kv_heads=kv_heads, position=None,
                         pallas_block_q=bq, pallas_block_kv=bkv, sliding_window=window,
                         pallas_products=products)


def _segments(length: int, cuts) -> jnp.ndarray:
  """[len(cuts), length] segment ids: each row's documents start at its cuts (after 0)."""
  rows = [np.searchsorted(np.asarray(c), np.arange(length), side="right") for c in cuts]
  return jnp.asarray(np.stack(rows), jnp.int32)


def kernel_case(packed: bool, *, heads=8, kv_heads=2, length=512):
  """[2, length] tokens of `heads` query heads over `kv_heads` of width 64: with packing, row 0
  has documents from 0, 100, 256 and 300 (one boundary on a block edge, blocks with one
  document and blocks with several), row 1 one document."""
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (2, length, n, 64))
             for key, n in zip(keys, (heads, kv_heads, kv_heads)))
  return q, k, v, _segments(length, [[100, 256, 300], []]) if packed else None


def kernel_against_xla(packed: bool, *, products: str = "transposed", mesh: bool = False):
  """(pallas_hd64's, xla's) (loss, (dq, dk, dv)) of a scalar loss of the attention output on
  `kernel_case(packed)` (GQA with two pairs of query heads a kv head; blocks of 256 queries by
  128 keys; a window of 200 that skips blocks), the products in form `products`; with `mesh`,
  through shard_map on a one-device mesh with the trainer's logical rules. Also measured on the
  chip by tests/tpu_tolerances.py."""
  q, k, v, seg = kernel_case(packed)
  cfg = _cfg(8, 2, bq=256, bkv=128, window=200, products=products)
  mask = Mask(spec=masks.Spec.of(cfg), segment_ids_BxL=seg)
  return against_xla(hd64.pallas_hd64_attention, q, k, v, mask, cfg, mesh=mesh)


def _assert_agree(got, want):
  """float32 rounding apart (on a TPU: the chip's tolerances), as the registry's shared test."""
  test_attention_impls._assert_agree(got, want, name="pallas_hd64")  # pylint: disable=protected-access


@pytest.mark.parametrize("window", [None, 1, 5, 17])
def test_blocks_agree_with_within(window):
  """Spec.blocks (some pair visible, every pair visible) against Spec.within over every pair of
  blocks of 4 queries by 6 keys of 48 positions."""
  spec = masks.Spec(sliding_window=window)
  index = np.arange(48)
  seen = spec.within(index[:, None], index[None])
  for qi in range(0, 48, 4):
    for kj in range(0, 48, 6):
      block = seen[qi:qi + 4, kj:kj + 6]
      some, every = spec.blocks(qi, qi + 3, kj, kj + 5)
      assert (bool(some), bool(every)) == (bool(block.any()), bool(block.all())), (qi, kj)


def test_tables_against_the_dense_mask():
  """Each block's kind against masks.Spec.dense over the same rows: SKIP only where nobody sees
  the block, FULL exactly where everybody does; the block loaded at each step is the step's own
  where it computes, else one that the same outer step computes; every kind occurs."""
  length, bq, bkv = 512, 128, 64
  spec = masks.Spec(sliding_window=200)
  seg = _segments(length, [[100, 256, 300], [], [64, 128]])
  lay = kernels.Layout(batch=3, length=length, pairs=1, units=1, per_unit=1, bq=bq, bkv=bkv,
                       spec=spec, segments=True, interpret=True)
  kind, kv_at, q_at = (np.asarray(t) for t in kernels.tables(lay, seg))
  kind = kind.reshape(3, lay.nq, lay.nk)
  kv_at, q_at = kv_at.reshape(kind.shape), q_at.reshape(3, lay.nk, lay.nq)
  index = jnp.arange(length)[None]
  dense = np.asarray(spec.dense(index, index, seg, seg))[:, 0]
  blocks = dense.reshape(3, lay.nq, bq, lay.nk, bkv)
  some, every = blocks.any(axis=(2, 4)), blocks.all(axis=(2, 4))
  assert not (some & (kind == kernels.SKIP)).any()
  np.testing.assert_array_equal(kind == kernels.FULL, every)
  assert {kernels.SKIP, kernels.FULL, kernels.PARTIAL} <= set(kind.ravel().tolist())
  computed = kind != kernels.SKIP
  for b in range(3):
    for i in range(lay.nq):
      for j in range(lay.nk):
        if computed[b, i, j]:
          assert kv_at[b, i, j] == j and q_at[b, j, i] == i
        else:
          assert computed[b, i, kv_at[b, i, j]] or not computed[b, i].any()
          assert computed[b, q_at[b, j, i], j] or not computed[b, :, j].any()


@pytest.mark.parametrize("products", FORMS)
@pytest.mark.parametrize("packed", [False, True])
def test_several_blocks_against_xla(packed, products):
  """Two kv heads each read by two pairs of query heads, blocks of 256 queries by 128 keys, a
  window that skips blocks: value and gradients against `xla`, plain and packed rows, in both
  forms of the products."""
  _assert_agree(*kernel_against_xla(packed, products=products))


@pytest.mark.parametrize("heads,kv_heads,bq,bkv,products", [
    (4, 4, 128, 128, "padded"), (6, 2, 128, 256, "transposed"), (4, 1, 128, 128, "padded"),
    (4, 4, 256, 128, "transposed")])
def test_every_kv_arrangement_against_xla(heads, kv_heads, bq, bkv, products):
  """MHA (a pair reads two kv heads side by side), an odd number of query heads a kv head (each
  repeated to its query heads) and MQA (one kv head, both lanes), packed rows, no window; each
  form of the products at least once."""
  q, k, v, seg = kernel_case(True, heads=heads, kv_heads=kv_heads,
                             length=512 if 256 in (bq, bkv) else 384)
  cfg = _cfg(heads, kv_heads, bq=bq, bkv=bkv, products=products)
  mask = Mask(segment_ids_BxL=seg)
  loss = lambda fn: jax.jit(jax.value_and_grad(
      lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask, cfg))), argnums=(0, 1, 2)))
  _assert_agree(loss(hd64.pallas_hd64_attention)(q, k, v), loss(xla_attention)(q, k, v))


def test_on_a_mesh_through_shard_map():
  """As the trainer runs it: under a mesh with the logical rules (shard_map on one device)."""
  _assert_agree(*kernel_against_xla(True, products="padded", mesh=True))


def _layout(cfg, **shape):
  return hd64.layout(cfg, **{"batch": 1, "length": 256, "heads": 4, "kv_heads": 4,
                             "head_dim": 64, "segments": False, "interpret": True, **shape})


def test_what_it_refuses_in_one_line():
  """head_dim other than 64, an odd number of query heads, a length its blocks do not divide,
  blocks that are not multiples of 128, a length whose gradients overflow VMEM."""
  for call, words in (
      (lambda: _layout(_cfg(4, 4), head_dim=128), "takes head_dim 64 (two heads fill the TPU's "
       "128 lanes), not 128; use splash"),
      (lambda: _layout(_cfg(3, 3), heads=3, kv_heads=3), "an even number of them on each "
       "device, not 3"),
      (lambda: _layout(_cfg(4, 4, bq=256), length=384), "the length 384 must be a multiple of "
       "the block 256 (attention.pallas_block_q"),
      (lambda: _cfg(4, 4, bkv=100).check(dim=256), "attention.pallas_block_kv must be a "
       "positive multiple of 128, got 100"),
      (lambda: _layout(_cfg(4, 4), length=2 ** 20), "sequences of 1048576 positions need more "
       "than the 100 MiB of VMEM")):
    with pytest.raises(ConfigError) as e:
      call()
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert _layout(_cfg(8, 2), heads=8, kv_heads=2)[0].per_unit == 2  # pairs sharing a kv head
  assert _layout(_cfg(6, 2), heads=6, kv_heads=2)[1] == 3  # each kv head to its 3 query heads


def test_the_cli_refuses_another_head_dim(capsys, tmp_path):
  """configs/tiny.py has head_dim 32: one line, exit 2, nothing written."""
  out = tmp_path / "run"
  code = main_lib.main(["axtrain", "--config=configs/tiny.py", f"--output_dir={out}",
                        "--config.model.block.attention.implementation=pallas_hd64"])
  err = capsys.readouterr().err
  assert code == 2 and not out.exists(), err
  assert err.startswith("axtrain: error: attention.implementation=pallas_hd64 takes head_dim 64")
  assert err.count("\n") == 1, err


def test_off_tpu_the_cli_notes_interpret_mode():
  """The launcher's one-line note for a Pallas TPU kernel off TPU names the implementation
  (attn_registry.Supports.native), splash's as before; none on a TPU or for `xla`."""
  from launcher import session  # pylint: disable=import-outside-toplevel
  ours = AttentionConfig(num_heads=4, position=None, implementation="pallas_hd64")
  note = session.kernel_note(ours, platform="cpu")
  assert note == ("attention.implementation=pallas_hd64 is a TPU kernel: on cpu it runs in "
                  "Pallas interpret mode (slow, for tests); xla or chunked attention is fast here")
  splash = AttentionConfig(num_heads=4, position=None, implementation="splash")
  assert session.kernel_note(splash, platform="cpu").startswith(
      "attention.implementation=splash is a TPU kernel: on cpu it runs in Pallas interpret mode")
  assert session.kernel_note(splash, platform="tpu") is None
  assert session.kernel_note(_cfg(4, 4), platform="cpu") is None


def test_the_plan_takes_the_kernels_own_figures_and_says_so():
  """planner/calibration.py: on v5e each kernel is planned at its own figures: pallas_hd64's
  forward pass and its forward and backward take the times that the chip measured side by side
  against splash's (0.6469 / 0.7393 ms and 1.4382 / 2.316 ms), and the row says where they came
  from; splash's row says nothing more; an implementation without a kernel keeps the row."""
  from planner import calibration  # pylint: disable=import-outside-toplevel
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  hw = meshes.lookup("tpu-v5e-1").hardware
  ours, splash, xla = (calibration.for_hardware(hw, attention=a)
                       for a in ("pallas_hd64", "splash", "xla"))
  # A forward pass of F FLOPs takes F / (attention x peak); with the backward, (1 + backward) x.
  assert splash.attention / ours.attention == pytest.approx(0.6469 / 0.7393)
  assert ((1 + ours.attention_backward) / ours.attention
          / ((1 + splash.attention_backward) / splash.attention)) == pytest.approx(1.4382 / 2.316)
  assert splash.attention_kernel == "splash" and splash.attention_note == ""
  assert ours.attention_kernel == "pallas_hd64" and "side by side on the chip" in ours.attention_note
  assert ours.attention_wrapper_timed and not splash.attention_wrapper_timed
  assert xla == splash


def test_the_ops_around_a_kernel_timed_with_them_are_not_counted_again():
  """The side-by-side times are of each implementation as a whole: a kernel planned from them
  leaves out the memory-bound ops inside the attention call (its layout's reshapes, copies at
  the calls), which splash's in-step figures never held; ops elsewhere count either way."""
  from planner import calibration, hlo_ops, plan  # pylint: disable=import-outside-toplevel
  from planner.hlo_collectives import Collectives  # pylint: disable=import-outside-toplevel
  from trainer import meshes  # pylint: disable=import-outside-toplevel
  entry = meshes.lookup("tpu-v5e-1")

  def op(primitive, category="copy/convert", nbytes=1e9, name="fusion.1"):
    return hlo_ops.Op(name=name, opcode="fusion", category=category, module="DecoderLM",
                      primitive=primitive, pass_="forward", count=1, narrow="", bytes=nbytes,
                      flops=0.0, sent=0.0, seconds=0.0)

  ops = (op(f"{plan.ATTENTION_SCOPE} reshape"), op("attention/position convert_element_type"),
         op(f"{plan.ATTENTION_SCOPE} flash_hd64_fwd_transposed pallas_call", category="kernel",
            name="flash_hd64_fwd_transposed.1"))
  compiled = plan.Compiled(argument=0, output=0, alias=0, temp=0, code=0, flops=0.0,
                           bytes_accessed=0.0, seconds=0.0,
                           collectives=Collectives(bytes_by_kind={}, count=0),
                           ops=hlo_ops.Report(ops=ops, compiler_bytes=0.0, compiler_flops=0.0))
  one = 1e9 / (calibration.for_hardware(entry.hardware).memory * entry.hardware.hbm_bandwidth)
  hbm = {a: plan.estimate(1e12, compiled, entry, call_flops=1e9, tokens=1,
                          attention=a).hbm_s for a in ("splash", "pallas_hd64")}
  assert hbm["splash"] == pytest.approx(2 * one) and hbm["pallas_hd64"] == pytest.approx(one)


@pytest.mark.slow  # the kernels compiled by libtpu for a v5e slice (about a minute on 2 cores)
def test_the_plan_compiles_the_kernels_and_times_them(capsys):
  """`axtrain plan` of configs/tiny.py at head_dim 64 with pallas_hd64 on tpu-v5e-4: the TPU
  compiler takes both kernels (forward and backward, by their names) and the estimate times them
  as one forward and `attention_backward` forward passes a layer, at its own share of peak."""
  import configs.tiny  # pylint: disable=import-outside-toplevel
  from planner import plan, plan_report  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib, meshes  # pylint: disable=import-outside-toplevel
  cfg = configs.tiny.get_config()
  cfg.model.block.attention.implementation = "pallas_hd64"
  cfg.model.block.attention.head_dim = 64
  entry = meshes.lookup("tpu-v5e-4")
  p = plan.plan(config_lib.parse(cfg), entry, config_name="configs/tiny.py", with_eval=False)
  cal = p.estimate.calibration
  calls = {}
  for op in p.train.ops.ops:
    if op.category == "kernel":
      calls[op.name.split(".")[0]] = calls.get(op.name.split(".")[0], 0) + op.count
  layers = cfg.model.num_layers
  assert calls == {"flash_hd64_fwd_transposed": layers, "flash_hd64_bwd_transposed": layers}
  rows, heads, length = cfg.data.batch_size // 4, 6, cfg.data.seq_len  # 8 rows over fsdp=4
  call = 4.0 * rows * heads * 64 * length * (length + 1) / 2  # QK^T and PV, causal pairs
  want = layers * (1 + cal.attention_backward) * call / (cal.attention * 197e12)
  assert p.estimate.kernel_s == pytest.approx(want, rel=1e-6)
  around = [op for op in p.train.ops.ops if plan.ATTENTION_SCOPE in op.primitive
            and op.category not in ("kernel", "matmul")]
  assert around, "the kernel's layout ops are named by the attention call's scope"
  assert cal.attention_kernel == "pallas_hd64"
  assert f"; {cal.attention_note}" in plan_report.text(p)


def test_the_memory_model_keeps_no_logits_for_it():
  """planner/memory_model.py:scores_share: a Pallas kernel (pallas_hd64 as splash) holds no
  [queries, keys] logits in HBM, where xla writes them all."""
  import configs.tiny  # pylint: disable=import-outside-toplevel
  from planner import memory_model  # pylint: disable=import-outside-toplevel
  from trainer import config as config_lib  # pylint: disable=import-outside-toplevel
  shares = {}
  for name in ("pallas_hd64", "splash", "xla"):
    cfg = configs.tiny.get_config()
    cfg.model.block.attention.implementation = name
    cfg.model.block.attention.head_dim = 64
    shares[name] = memory_model.scores_share(config_lib.parse(cfg), 128)
  assert shares == {"pallas_hd64": (0.0, 0.0, 0.0), "splash": (0.0, 0.0, 0.0),
                    "xla": (1.0, 1.0, 1.0)}
