"""Attention kernels alone on the chip: forward and forward + backward per kernel and block sizes,
causal, packed documents, head_dim 64 (issue 46; docs/chip.md, "Attention kernels at head_dim 64").

On the lent TPU chip, after `../shared/chip/wheels.sh` and `bash benchmarks/tokamax_wheels.sh`
here (tokamax's pinned wheels into .chip/tokamax):

    bash .chip/on_chip.sh bash benchmarks/attention_on_chip.sh --out=$OUT [--shape=1b] ...

(the script installs tokamax from .chip/tokamax where it is there, then runs
`python3 -m benchmarks.attention`). Anywhere else the kernels run in Pallas interpret mode:
the figures mean nothing there, the run only checks that every kernel runs. Before spending chip
time, `python -m benchmarks.attention --out=DIR --compile_only` compiles every kernel and block
size for a v5e chip here, with libtpu's compile-only topology (a block that overflows VMEM
fails there as it would on the chip), and writes a line per kernel saying so.

Each kernel attends [rows, seq, heads, 64] bfloat16 queries over kv heads with the causal mask
and `--docs` documents a row (segment ids, cut at seeded random places, the same for every
kernel): `splash` (jax's Pallas kernel as modules/attn_splash.py calls it, the transposes to its
heads-major layout included) at SPLASH_BLOCKS, `pallas_hd64` (modules/attn_pallas_hd64.py, ours)
at OUR_BLOCKS in each form of its products (PRODUCTS), tokamax's splash kernel at TOKAMAX_BLOCKS where tokamax is importable (else one
`skipped` line says why), and `xla` once for scale. Each is timed as a jitted forward, and as a
jitted gradient of sum(out x a fixed cotangent) with respect to q, k and v (forward and backward):
the median over --rounds of the mean of --steps calls. Compiling is most of a run's time (on the
chip, 16 kernels at 125m's shape took 170 s one after another): every kernel is compiled first,
--compile_threads at once, and then each is timed alone.

The work of one forward pass is F = 4 x seq^2 / 2 x 64 x heads x rows FLOPs (QK^T and PV over
half the square: the causal FLOPs, documents not subtracted); the backward counts 2.5 F
(FlashAttention's count, the logits recomputed), forward and backward 3.5 F. Each line of
--out/attention.jsonl gives a kernel's times, its TFLOP/s and share of --peak_tflops (v5e: 197)
on each, `backward_passes` (the backward's time in forward passes, as planner/calibration.py
counts it) and the largest difference of its output from xla's; a kernel that fails to compile
or run gives its error instead.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.metadata
import json
import os
import pathlib
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

HEAD_DIM = 64
# Rows each device attends at a time in the recipes as shipped on one chip (configs/llama.py:
# 125m, 4 rows a microbatch; configs/llm_1b.py, 8), and their heads.
SHAPES = {"125m": (4, 12, 12), "1b": (8, 32, 8)}
# (block_q, block_kv, block_kv_compute), forward and fused backward alike; modules/attn_splash.py
# ships (1024, 1024, 512).
SPLASH_BLOCKS = ((512, 512, 512), (1024, 1024, 512), (1024, 1024, 1024), (2048, 1024, 512),
                 (1024, 512, 512))
# (pallas_block_q, pallas_block_kv), each in every form of pallas_products; modules/attention.py
# ships (512, 512), transposed.
OUR_BLOCKS = ((256, 512), (512, 512), (512, 1024), (1024, 512), (1024, 1024))
PRODUCTS = ("transposed", "padded")
# (block_q, block_kv, block_kv_compute, use_experimental_scheduler) of tokamax's splash fork.
TOKAMAX_BLOCKS = ((1024, 1024, 512, False), (1024, 1024, 512, True), (512, 512, 512, True))
TOKAMAX = "0.0.12"  # the version benchmarks/tokamax_wheels.sh pins


@dataclasses.dataclass(frozen=True)
class Case:
  rows: int
  seq: int
  heads: int
  kv_heads: int
  docs: int

  @property
  def forward_flops(self) -> float:
    """F: QK^T and PV (2 x 2 FLOPs a query, key and head_dim) over half the square."""
    return 4.0 * self.seq ** 2 / 2 * HEAD_DIM * self.heads * self.rows


def segments(case: Case, seed: int = 0) -> np.ndarray:
  """[rows, seq] int32 segment ids: `docs` documents a row, cut at seeded random places."""
  rng = np.random.default_rng(seed)
  ids = [np.searchsorted(np.sort(rng.choice(np.arange(1, case.seq), case.docs - 1,
                                            replace=False)), np.arange(case.seq), side="right")
         for _ in range(case.rows)]
  return np.stack(ids).astype(np.int32)


def _splash(case: Case, blocks, seg, *, interpret: bool):
  """jax's splash kernel as modules/attn_splash.py:_kernel calls it, with `blocks`."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa  # pylint: disable=import-outside-toplevel
  bq, bkv, compute = blocks
  sizes = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=compute, block_q_dkv=bq,
                        block_kv_dkv=bkv, block_kv_dkv_compute=compute,
                        use_fused_bwd_kernel=True)
  mask = sa.MultiHeadMask([sa.CausalMask((case.seq, case.seq))] * case.heads)
  kernel = sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              interpret=interpret)
  return _heads_major(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)), seg)


def _tokamax(case: Case, blocks, seg, *, interpret: bool):
  """tokamax's fork of splash (tokamax._src: pinned version), its base-2 exponent on."""
  # pylint: disable=import-outside-toplevel
  from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as tk
  from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask as tm
  bq, bkv, compute, scheduler = blocks
  config = tk.SplashConfig(block_q=bq, block_kv=bkv, block_kv_compute=compute, block_q_dkv=bq,
                           block_kv_dkv=bkv, block_kv_dkv_compute=compute,
                           use_base2_exp=True, use_experimental_scheduler=scheduler,
                           interpret=interpret)
  kernel = tk.make_splash_mha(tm.CausalMask((case.seq, case.seq)), config=config, q_seq_shards=1)
  return _heads_major(lambda q, k, v, s: kernel(q, k, v, segment_ids=tk.SegmentIds(s, s)), seg)


def _heads_major(kernel, seg):
  """attend(q, k, v) on [B, L, H, 64] through a kernel of [H, L, 64] per row: queries scaled,
  transposed there and back, vmapped over the rows."""
  def attend(q, k, v):
    q = (q * HEAD_DIM ** -0.5).astype(q.dtype)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    return jax.vmap(kernel)(q, k, v, seg).transpose(0, 2, 1, 3)
  return attend


def _ours(case: Case, blocks, seg, *, interpret: bool):
  """modules/attn_pallas_hd64.py, in interpret mode unless traced under a TPU mesh."""
  # pylint: disable=import-outside-toplevel
  from modules.attention import AttentionConfig
  from modules.attn_pallas_hd64 import pallas_hd64_attention
  from modules.masks import Mask
  del interpret  # the implementation's own choice, from the mesh it is traced under
  cfg = AttentionConfig(num_heads=case.heads, num_kv_heads=case.kv_heads, position=None,
                        pallas_block_q=blocks[0], pallas_block_kv=blocks[1],
                        pallas_products=blocks[2])
  return lambda q, k, v: pallas_hd64_attention(q, k, v, Mask(segment_ids_BxL=seg), cfg)


def _xla(case: Case, blocks, seg, *, interpret: bool = False):
  # pylint: disable=import-outside-toplevel
  from modules.attention import AttentionConfig
  from modules.attn_xla import xla_attention
  from modules.masks import Mask
  del blocks, interpret
  cfg = AttentionConfig(num_heads=case.heads, num_kv_heads=case.kv_heads, position=None)
  return lambda q, k, v: xla_attention(q, k, v, Mask(segment_ids_BxL=seg), cfg)


KERNELS = {"xla": (_xla, ((),)), "splash": (_splash, SPLASH_BLOCKS),
           "pallas_hd64": (_ours, tuple((*b, p) for p in PRODUCTS for b in OUR_BLOCKS)),
           "tokamax_splash": (_tokamax, TOKAMAX_BLOCKS)}


def timed(fn, args, *, rounds: int, steps: int) -> float:
  """Seconds a call: the median over `rounds` of the mean of `steps` calls (compiled and run
  once before)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / steps)
  return statistics.median(times)


def programs(case: Case, kernel: str, blocks, inputs) -> tuple:
  """`kernel` at `blocks` compiled for `inputs` (q, k, v, cotangent, segments): its jitted
  forward, and its gradient of sum(out x cotangent) with respect to q, k and v (forward and
  backward)."""
  q, k, v, cotangent, seg = inputs
  attend = KERNELS[kernel][0](case, blocks, seg, interpret=jax.default_backend() != "tpu")
  both = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) * cotangent),
                  argnums=(0, 1, 2))
  return tuple(jax.jit(fn).lower(q, k, v).compile() for fn in (attend, both))


def measure(case: Case, compiled: tuple, inputs, reference, *, peak: float, rounds: int,
            steps: int) -> dict:
  """One line of the table: a kernel's compiled (forward, forward and backward) on `inputs`."""
  forward, both = compiled
  q, k, v = inputs[:3]
  fwd_s = timed(forward, (q, k, v), rounds=rounds, steps=steps)
  both_s = timed(both, (q, k, v), rounds=rounds, steps=steps)
  flops = case.forward_flops
  diff = (None if reference is None else float(jnp.max(jnp.abs(
      forward(q, k, v).astype(jnp.float32) - reference))))
  return {"fwd_ms": fwd_s * 1e3, "fwd_bwd_ms": both_s * 1e3,
          "fwd_tflops": flops / fwd_s / 1e12, "fwd_share": flops / fwd_s / peak,
          "fwd_bwd_tflops": 3.5 * flops / both_s / 1e12,
          "fwd_bwd_share": 3.5 * flops / both_s / peak,
          "backward_passes": (both_s - fwd_s) / fwd_s, "max_abs_diff_vs_xla": diff}


def compile_only(case: Case, kernel: str, blocks) -> dict:
  """Whether `kernel` at `blocks` compiles, forward and forward + backward, for one v5e chip
  (libtpu's compile-only topology, as `axtrain plan --mesh=tpu-v5e-1` compiles)."""
  # pylint: disable=import-outside-toplevel
  from planner import plan
  from trainer import meshes
  devices, _ = plan.target_devices(meshes.lookup("tpu-v5e-1"))
  on = jax.sharding.SingleDeviceSharding(devices[0])
  shape = (case.rows, case.seq)
  q, k, v = (jax.ShapeDtypeStruct((*shape, n, HEAD_DIM), jnp.bfloat16, sharding=on)
             for n in (case.heads, case.kv_heads, case.kv_heads))
  # Made outside the chip's mesh (under it, an eager op would run on the compile-only devices).
  attend = KERNELS[kernel][0](case, blocks, segments(case), interpret=False)
  with jax.set_mesh(jax.sharding.Mesh(np.array(devices[:1]), ("data",))):
    loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32))
    for fn in (attend, jax.grad(loss, argnums=(0, 1, 2))):
      text = jax.jit(fn).lower(q, k, v).compile().as_text()
  return {"compiled": True, "native": "tpu_custom_call" in text}


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _tokamax_missing() -> str | None:
  """Why tokamax's kernels are skipped, or None when they can run."""
  try:
    import tokamax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    return (f"tokamax is not importable ({e}); `bash benchmarks/tokamax_wheels.sh` here puts "
            f"tokamax=={TOKAMAX} in .chip/tokamax, benchmarks/attention_on_chip.sh installs it")
  return None


def _blocks(text: str, width: int):
  """'512x512,1024x512' -> ((512, 512), (1024, 512)); each entry `width` numbers."""
  out = tuple(tuple(int(n) for n in b.split("x")) for b in text.split(",") if b)
  if any(len(b) != width for b in out):
    raise SystemExit(f"benchmarks.attention: blocks '{text}': each needs {width} numbers "
                     f"joined by x")
  return out


def _inputs(case: Case):
  """((q, k, v, cotangent, segment ids), xla's output) of seeded random bfloat16 inputs."""
  keys = jax.random.split(jax.random.key(0), 4)
  shape = (case.rows, case.seq)
  q, k, v = (jax.random.normal(key, (*shape, n, HEAD_DIM), jnp.bfloat16)
             for key, n in zip(keys, (case.heads, case.kv_heads, case.kv_heads)))
  cotangent = jax.random.normal(keys[3], (*shape, case.heads, HEAD_DIM), jnp.float32)
  seg = jnp.asarray(segments(case))
  return (q, k, v, cotangent, seg), jax.jit(_xla(case, (), seg))(q, k, v).astype(jnp.float32)


def parse(argv):
  p = argparse.ArgumentParser(prog="python -m benchmarks.attention")
  p.add_argument("--out", required=True, help="folder for attention.jsonl (the device's $OUT)")
  p.add_argument("--shape", default="125m", help=f"rows and heads: {', '.join(SHAPES)}, or "
                                                 "ROWSxHEADSxKV_HEADS")
  p.add_argument("--seq", type=int, default=2048, help="positions a row")
  p.add_argument("--docs", type=int, default=4, help="documents a row (segment ids)")
  p.add_argument("--kernels", default=",".join(KERNELS), help="which of " + ", ".join(KERNELS))
  p.add_argument("--splash_blocks", default="", help="QxKVxCOMPUTE,... (default SPLASH_BLOCKS)")
  p.add_argument("--our_blocks", default="", help="QxKV,... (default OUR_BLOCKS)")
  p.add_argument("--products", default=",".join(PRODUCTS),
                 help="pallas_hd64's forms of the products to time (attention.pallas_products)")
  p.add_argument("--tokamax_blocks", default="",
                 help="QxKVxCOMPUTExSCHEDULER(0/1),... (default TOKAMAX_BLOCKS)")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=10, help="calls timed together in a round")
  p.add_argument("--peak_tflops", type=float, default=197.0, help="bf16 peak (v5e: 197)")
  p.add_argument("--compile_threads", type=int, default=min(8, os.cpu_count() or 1),
                 help="kernels compiled at once, all before any is timed (compiling is most "
                      "of a run's time; the timings run alone afterwards)")
  p.add_argument("--compile_only", action="store_true",
                 help="compile each kernel for a v5e chip here (libtpu), time nothing")
  args = p.parse_args(argv)
  unknown = set(args.kernels.split(",")) - set(KERNELS)
  if unknown:
    raise SystemExit(f"benchmarks.attention: unknown kernels {sorted(unknown)}; "
                     f"kernels: {', '.join(KERNELS)}")
  return args


def main(argv=None) -> int:
  args = parse(sys.argv[1:] if argv is None else argv)
  rows, heads, kv_heads = SHAPES.get(args.shape) or _blocks(args.shape, 3)[0]
  case = Case(rows=rows, seq=args.seq, heads=heads, kv_heads=kv_heads, docs=args.docs)
  blocks = {"splash": _blocks(args.splash_blocks, 3) or SPLASH_BLOCKS,
            "pallas_hd64": tuple((*b, p) for p in args.products.split(",")
                                 for b in _blocks(args.our_blocks, 2) or OUR_BLOCKS),
            "tokamax_splash": tuple((*b[:3], bool(b[3])) for b in _blocks(args.tokamax_blocks, 4))
                              or TOKAMAX_BLOCKS}
  inputs, reference = (None, None) if args.compile_only else _inputs(case)
  head = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
          "libtpu": _version("libtpu"), "tokamax": _version("tokamax"),
          **dataclasses.asdict(case), "head_dim": HEAD_DIM, "forward_flops": case.forward_flops,
          "peak_tflops": args.peak_tflops}
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with open(out / "attention.jsonl", "a", encoding="utf-8") as f:
    def emit(row):
      f.write(json.dumps({**head, **row}) + "\n")
      f.flush()
      print("benchmarks.attention: " + json.dumps(row), flush=True)

    jobs = []  # (kernel, blocks) to compile and time, in the table's order
    for kernel in args.kernels.split(","):
      if kernel.startswith("tokamax") and (why := _tokamax_missing()):
        emit({"kernel": kernel, "skipped": why})
        continue
      if kernel == "pallas_hd64" and case.heads % 2:
        emit({"kernel": kernel, "skipped": "an odd number of heads"})
        continue
      jobs += [(kernel, b) for b in blocks.get(kernel, KERNELS[kernel][1])]
    work = ((lambda kernel, b: compile_only(case, kernel, b)) if args.compile_only else
            (lambda kernel, b: programs(case, kernel, b, inputs)))
    with concurrent.futures.ThreadPoolExecutor(max(1, args.compile_threads)) as pool:
      made = [pool.submit(work, kernel, b) for kernel, b in jobs]
      concurrent.futures.wait(made)
    for (kernel, b), future in zip(jobs, made):
      try:
        row = (future.result() if args.compile_only else
               measure(case, future.result(), inputs, reference,
                       peak=args.peak_tflops * 1e12, rounds=args.rounds, steps=args.steps))
      except Exception as e:  # pylint: disable=broad-except  (a config that fails: its line)
        row = {"error": " ".join(str(e).split())[:300],
               "where": traceback.format_exc().strip().splitlines()[-1][:200]}
      emit({"kernel": kernel, "blocks": list(b), **row})
  return 0


if __name__ == "__main__":
  sys.exit(main())
