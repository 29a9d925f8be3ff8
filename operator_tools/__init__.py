"""The tools an operator runs from a laptop or CI, in the project's venv: the tested logic behind
``scripts/preflight.py``, ``verify.py``, ``orphans.py``, ``overlap.py`` and ``bench_ttft.py`` (the
scripts are thin argparse entry points; ``scripts/plan.py`` reads :mod:`capacity`).

Modules:
    cli          the convention every script follows: exit codes, error lines, broken pipes, help.
    preflight    pre-deploy checks of the AWS account.
    verify       post-deploy checks: pure functions over Kubernetes/AWS dicts plus a thin live reader.
    orphans      deployed line stacks whose business line left the config.
    overlap      share of prompt tokens a perfect cross-pod prefix cache serves, from a request log.
    bench_ttft   cold vs warm TTFT against an OpenAI-compatible streaming endpoint.
    plots        the --plot figures (matplotlib, Agg).
"""
