"""Infrastructure below every other folder: registries, typed config nodes, config errors.

`modules/`, `trainer/`, `launcher/` and `configs/` all import from here; nothing
here imports from them.
"""
