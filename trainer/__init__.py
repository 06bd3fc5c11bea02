"""Turns a parsed run config into a sharded, jitted train step and runs the loop."""
