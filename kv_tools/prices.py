"""The planner's price table, ``config/prices.yaml``: one price per region and instance type,
each with the date it was read and where from.

Validated with pydantic like the rest of ``config/``: unknown keys, unknown instance types,
non-positive prices and prices without a source are errors that name the file and the field.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from platform_config import INSTANCE_TYPES
from platform_config.loader import ConfigError, ConfigProblem

DEFAULT_PRICES_FILE = Path(__file__).resolve().parents[1] / "config" / "prices.yaml"


class Price(BaseModel):
    """One on-demand price.

    Attributes:
        usd_per_hour: price of one instance for one hour, in ``PriceTable.currency``.
        as_of: the day the price was read.
        source: URL or document the price comes from.
        checked: false while the value has not been compared with ``source``; the planner
            warns about every unchecked price it uses.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_hour: Annotated[float, Field(gt=0)]
    as_of: dt.date
    source: Annotated[str, StringConstraints(min_length=8)]
    checked: bool = False


def _known_instance_type(name: str) -> str:
    if name not in INSTANCE_TYPES:
        raise ValueError(f"unknown instance type {name!r}; allowed: {', '.join(sorted(INSTANCE_TYPES))}")
    return name


KnownInstanceType = Annotated[str, AfterValidator(_known_instance_type)]


class PriceTable(BaseModel):
    """``config/prices.yaml``: ``regions -> instance type -> Price``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    regions: dict[Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$")],
                  dict[KnownInstanceType, Price]]

    def price(self, region: str, instance_type: str) -> Price | None:
        """The price of ``instance_type`` in ``region``, or None when the table has none."""
        return self.regions.get(region, {}).get(instance_type)


def load_prices(path: str | Path = DEFAULT_PRICES_FILE) -> PriceTable:
    """Read and validate a price table.

    Raises:
        ConfigError: missing file, invalid YAML, or invalid fields (each problem names the
            file and the dotted field path).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(str(path), "", "file not found")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(str(path), "", f"not valid YAML: {exc}")]) from None
    try:
        return PriceTable.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError([
            ConfigProblem(str(path), ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, "))
            for err in exc.errors(include_url=False)
        ]) from None
