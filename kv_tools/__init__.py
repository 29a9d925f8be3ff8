"""Operator tools: the tested logic behind ``scripts/plan.py``, ``overlap.py``, ``bench_ttft.py``,
``verify.py`` and ``preflight.py`` (the scripts are thin argparse entry points).

Modules:
    model_specs  architecture facts of the known models, or read from a HF ``config.json``.
    prices       the price table ``config/prices.yaml`` (dated, sourced prices).
    planner      capacity, latency (calibrated on the reference run) and cost; recommendation.
    overlap      share of prompt tokens a perfect cross-pod prefix cache serves, from a request log.
    bench_ttft   cold vs warm TTFT against an OpenAI-compatible streaming endpoint.
    verify       post-deploy checks: pure functions over Kubernetes/AWS dicts plus a thin live reader.
    preflight    pre-deploy checks of the AWS account.
    cli          the convention every script follows: exit codes, error lines, broken pipes, help.
    gpu_memory   GPU memory vLLM can budget per GPU model (sourced), for the planner's fit.
    plots        the --plot figures (matplotlib, Agg).
"""
