"""`make bench`: the benchmark suite (`python -m benchmarks.run`) and its reference step."""
