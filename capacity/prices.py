"""The planner's price table, ``config/prices.yaml``: one price per region and instance type,
each with the date it was read and where from.

Validated with pydantic like the rest of ``config/``: unknown keys, unknown instance types,
non-positive prices and prices without a source are errors that name the file and the field.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from platform_config.loader import parse_model
from platform_config.yaml_source import read_yaml_document
from platform_config.fields import AWS_REGION_PATTERN, KnownInstanceType

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


class PriceTable(BaseModel):
    """``config/prices.yaml``: ``regions -> instance type -> Price``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    regions: dict[Annotated[str, StringConstraints(pattern=AWS_REGION_PATTERN)], dict[KnownInstanceType, Price]]

    def price(self, region: str, instance_type: str) -> Price | None:
        """The price of ``instance_type`` in ``region``, or None when the table has none."""
        return self.regions.get(region, {}).get(instance_type)


def load_prices(path: str | Path = DEFAULT_PRICES_FILE) -> PriceTable:
    """Read and validate a price table.

    Raises:
        ConfigError: an unreadable file, invalid YAML, or invalid fields (each problem names the
            file and the dotted field path or the line).
    """
    path = Path(path)
    return parse_model(PriceTable, path, read_yaml_document(path))
