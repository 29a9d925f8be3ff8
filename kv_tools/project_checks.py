"""Loading a project as every command does: the config layer's checks, then the planner's.

``platform_config`` is the bottom layer and imports nothing above it (``tests/test_layers.py``), so
a check that needs the planner lives here, in the layer that owns the planner, and is handed to the
config loader as a :data:`platform_config.loader.LineCheck`. ``app.py``, ``scripts/manifests.py``
and every tool load through :func:`load_checked_project`, so ``make synth`` and the tools refuse
the same configs (a test keeps every entry point on it).
"""

from __future__ import annotations

from pathlib import Path

from kv_tools.planner import LINE_CONFIG_FIELDS, PlanInputError, choose_tp, inputs_from_line
from platform_config import BusinessLineConfig, ConfigProblem, PlatformConfig, ProjectConfig, load_project


def model_fit_problems(
    platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]]
) -> tuple[list[ConfigProblem], list[str]]:
    """Each line's model must fit ``gpus_per_replica`` GPUs of its instance type.

    The rule is the planner's, called, not copied: :func:`kv_tools.planner.choose_tp` over
    :func:`kv_tools.planner.inputs_from_line`, i.e. exactly what ``scripts/plan.py
    --business-line <file>`` reports with its default flags (weights per GPU plus the runtime
    reserve within vLLM's ``--gpu-memory-utilization`` share, and room left for one sequence of
    ``--max-model-len`` tokens, or of the planner's default prompt). So synthesis refuses what
    the planner says does not fit, and nothing else.

    A model the planner's table (``kv_tools/model_specs.py``, matched by normalized
    ``model.name``) does not know cannot be sized offline: its fit is skipped and a warning
    names the file and the command that checks it (``plan.py --hf-config``).

    Returns:
        ``(problems, warnings)``.
    """
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    for path, line in lines:
        try:
            inputs = inputs_from_line(line, platform)
        except KeyError:  # the only KeyError of inputs_from_line: the model is not in the table
            warnings.append(
                f"{path}: model.name {line.model.name!r} is not in the planner's table (kv_tools/model_specs.py), "
                f"so whether it fits {line.instance_type} with gpus_per_replica {line.gpus_per_replica} is not "
                f"checked; check it with: scripts/plan.py --business-line {path} --hf-config <its config.json>")
            continue
        except PlanInputError as exc:  # each problem names its planner field; report the config key
            problems += [ConfigProblem(str(path), LINE_CONFIG_FIELDS.get(p.field, p.field), p.message)
                         for p in exc.problems]
            continue
        fit, min_tp = choose_tp(inputs)
        if fit.fits:
            continue
        allowed = (f"gpus_per_replica {min_tp} or more" if min_tp is not None
                   else "an instance type with more GPU memory, or a smaller model or dtype")
        problems.append(ConfigProblem(
            str(path), "gpus_per_replica",
            f"{line.model.name} ({line.model.dtype}) does not fit {line.instance_type} at "
            f"gpus_per_replica {line.gpus_per_replica}: {fit.reason}; allowed: {allowed} "
            f"(scripts/plan.py --business-line {path} shows the figures)", line.gpus_per_replica))
    return problems, warnings


def load_checked_project(config_dir: str | Path) -> ProjectConfig:
    """:func:`platform_config.load_project` of ``config_dir`` with the planner's fit
    (:func:`model_fit_problems`) as one more check: what ``make synth``, ``make manifests`` and
    every tool load.

    Raises:
        ConfigError: every problem of every file, the planner's included, each naming the file,
            the field or line, and what is allowed.
    """
    return load_project(config_dir, line_checks=(model_fit_problems,))
