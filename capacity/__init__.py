"""Capacity planning: what a model needs on an instance type, what the L2 saves, what it costs.

Synthesis uses it (every command loads the config through :mod:`capacity.project_checks`, whose
fit and hot-prefix checks need the model facts), and so do the operator's ``scripts/plan.py`` and
``--plot`` figures.

Modules:
    model_specs     architecture facts of the known models, or read from a HF ``config.json``.
    gpu_memory      GPU memory vLLM can budget per GPU model (sourced).
    fit             the planner's inputs, and the memory fit of a replica on a GPU and on a node.
    latency         cold vs warm TTFT, calibrated on the reference run.
    prices          the price table ``config/prices.yaml`` (dated, sourced prices).
    planner         the plan (fit, times, cost), the recommendation across instance types, the report.
    project_checks  loading a project as every command does: the config checks plus the planner's.
    routing_sim     a deterministic simulator of one line's routing (Mooncake-fitted traces, the operator's
                    strategies as production-stack implements them, the L2 at the planner's read cost).
"""
