"""`axtrain launch`: one run on several processes or machines, through a real scheduler.

command.py is the subcommand (flags, the checks every backend shares, the launch record);
checks.py makes the checks a run makes before it touches the disk; job.py is what every backend
is handed (`Job`) and implements (`Backend`); layout.py turns the mesh entry into hosts and
processes. One module per backend: local.py, slurm.py, k8s.py, tpu_vm.py. Imports run one way:
command -> checks, backends -> job -> layout; nothing here imports command.py, and this file
imports nothing (a backend's import does not load the others).
"""
