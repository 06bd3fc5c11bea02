"""Answers "will it fit, and how fast" before hardware is rented: compiles a run's steps for a
mesh entry's devices (planner/plan.py), reports them (plan_report) and ranks settings
(plan_sweep: what it tries, sweep_space; the analytic screen, sweep_screen), the analytic memory
model, HLO op and collective accounting, what the compiler logs (compiler_output), the GPU
compiler's targets, and the memory check of a run's compiled steps against the device it is
about to train on (step_memory).

Above trainer/ (it builds experiments to compile them), below launcher/ (`axtrain plan`)."""
