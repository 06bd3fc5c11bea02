"""A Hugging Face model folder as `axtrain convert` reads it: config.json, its family
(modules/hf_maps.py:FAMILIES), and the tensors of its safetensors file(s), checked against the
shapes that config.json implies.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from launcher.errors import UserError

def read_json(path: pathlib.Path, what: str) -> dict:
  """A JSON file of the folder; a missing or invalid one is a UserError (`what`: the folder's
  kind, for the message)."""
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    raise UserError(f"{path.parent} has no {path.name}; {what}") from None
  except ValueError as e:
    raise UserError(f"{path} is not valid JSON: {e}") from None


def family(hf_cfg: dict, hf_dir: pathlib.Path):
  """The Hugging Face family (modules/hf_maps.py:FAMILIES) of a folder's config.json."""
  from modules.hf_maps import FAMILIES  # pylint: disable=import-outside-toplevel
  by_type = {f.name: arch for arch, f in FAMILIES.items()}
  archs = hf_cfg.get("architectures") or [by_type.get(hf_cfg.get("model_type"), "")]
  arch = archs[0]
  if not arch and "model_type" not in hf_cfg:
    what = (" (it is an axtrain run directory: export it with --to_hf)"
            if (hf_dir / "run.json").is_file() else "")
    raise UserError(f"--from_hf {hf_dir} is not a Hugging Face model folder: its config.json "
                    f"names no architectures or model_type{what}")
  if arch not in FAMILIES:
    raise UserError(f"{hf_dir}: model '{arch or hf_cfg.get('model_type')}' is not supported; "
                    f"supported: {', '.join(FAMILIES)}")
  return FAMILIES[arch]


class SafetensorsDir:
  """Lazy access to the tensors of a directory's safetensors file(s), by name."""

  def __init__(self, hf_dir: pathlib.Path, family):
    from safetensors import safe_open  # pylint: disable=import-outside-toplevel
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
      files = sorted(set(read_json(index, "").get("weight_map", {}).values()))
      missing = [f for f in files if not (hf_dir / f).exists()]
      if missing:
        raise UserError(f"{index} names {missing[0]}, which is not in {hf_dir}")
    else:
      files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
    if not files:
      raise UserError(f"{hf_dir} holds no *.safetensors weights (pytorch .bin files are not read;"
                      f" re-save with safe_serialization=True)")
    self.handles = []
    self.where: dict[str, tuple] = {}
    for name in files:
      try:
        handle = safe_open(str(hf_dir / name), framework="numpy")
      except Exception as e:  # pylint: disable=broad-except  (safetensors raises its own types)
        raise UserError(f"{hf_dir / name}: not a readable safetensors file ({e})") from None
      self.handles.append(handle)
      for key in handle.keys():
        ours = key
        if family.name == "gpt2" and not key.startswith(("transformer.", "lm_head.")):
          ours = "transformer." + key  # the original openai-community files have no prefix
        self.where[ours] = (handle, key)

  def shape(self, name: str) -> tuple:
    handle, key = self.where[name]
    return tuple(handle.get_slice(key).get_shape())

  def dtype(self, name: str) -> str:
    handle, key = self.where[name]
    return handle.get_slice(key).get_dtype()

  def get(self, name: str) -> np.ndarray:
    handle, key = self.where[name]
    return handle.get_tensor(key).astype(np.float32)


def check_tensors(st: SafetensorsDir, family, hf_cfg: dict, hf_dir: pathlib.Path) -> None:
  """Every tensor that `family` expects of `hf_cfg`, at its shape, and no other."""
  expected = family.hf_shapes(hf_cfg)
  for name, shape in expected.items():
    if name not in st.where:
      raise UserError(f"{hf_dir}: missing tensor '{name}' (expected shape {shape} from "
                      f"config.json)")
    if st.shape(name) != tuple(shape):
      raise UserError(f"{hf_dir}: tensor '{name}' has shape {st.shape(name)} but config.json "
                      f"implies {tuple(shape)}")
  tied_head = "lm_head.weight" not in expected  # some files keep a copy of the tied head
  for name in st.where:
    if name not in expected and not name.endswith(family.ignored) and not (
        tied_head and name == "lm_head.weight"):
      raise UserError(f"{hf_dir}: unexpected tensor '{name}' {st.shape(name)} for a "
                      f"{family.architecture} with this config.json")
