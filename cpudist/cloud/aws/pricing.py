"""Hourly prices: spot from the price history, on-demand from a dated table kept in the package."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from cpudist.cloud.aws.client import call
from cpudist.cloud.provider import Price


def price_table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(resources.files("cpudist.cloud.aws").joinpath(
                                      "prices.json").read_text())
    return table


def on_demand_price(instance_type: str, region: str) -> Price:
    table = price_table()
    base = table["on_demand"].get(instance_type)
    if base is None:
        return Price(None,
                     f"no on-demand price for {instance_type} in the table of {table['_date']}")
    factor = table["region_factor"].get(region, 1.0)
    return Price(round(base * factor, 4), f"on-demand table of {table['_date']}")


def spot_price(ec2: Any, instance_type: str, zone: str | None) -> Price:
    """The latest spot price of the zone (or the cheapest zone) from the price history."""
    kwargs: dict[str, Any] = {"InstanceTypes": [instance_type],
                              "ProductDescriptions": ["Linux/UNIX"],
                              "StartTime": datetime.now(UTC), "MaxResults": 100}
    if zone:
        kwargs["AvailabilityZone"] = zone
    history = call(ec2.describe_spot_price_history, **kwargs)["SpotPriceHistory"]
    if not history:
        return Price(None, "no spot price history")
    latest = max(history, key=lambda h: h["Timestamp"])
    return Price(float(latest["SpotPrice"]), f"spot price history ({latest['AvailabilityZone']})")


def hourly_price(ec2: Any, instance_type: str, region: str, spot: bool, zone: str | None) -> Price:
    if spot:
        price = spot_price(ec2, instance_type, zone)
        if price.usd_per_hour is not None:
            return price
    return on_demand_price(instance_type, region)
