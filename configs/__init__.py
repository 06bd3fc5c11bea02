"""Run configs: each `*.py` here (but base.py) has `get_config(arg=None) -> ConfigDict`."""
