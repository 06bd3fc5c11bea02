"""Answers "will it fit, and how fast" before hardware is rented: compiles a run's steps for a
mesh entry's devices (planner/plan.py), reports and ranks them (plan_report, plan_sweep), the
analytic memory model, HLO op and collective accounting, the GPU compiler's targets, and the
memory check of a run's compiled steps against the device it is about to train on (step_memory).

Above trainer/ (it builds experiments to compile them), below launcher/ (`axtrain plan`)."""
