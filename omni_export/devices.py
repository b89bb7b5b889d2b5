"""Target devices: name -> chipset and the QNN HTP identifiers the simulator and context binaries need."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import RecipeError


@dataclass(frozen=True)
class Device:
    name: str
    display: str
    chipset: str
    soc_model: int
    htp_arch: int
    hub_name: str  # the device name Qualcomm AI Hub lists

    def to_dict(self) -> dict:
        return asdict(self)


DEVICES = {d.name: d for d in (
    Device("galaxy_s25", "Samsung Galaxy S25 (Snapdragon 8 Elite for Galaxy)", "SM8750", 69, 79, "Samsung Galaxy S25 (Family)"),
    Device("galaxy_s24", "Samsung Galaxy S24 (Snapdragon 8 Gen 3)", "SM8650", 57, 75, "Samsung Galaxy S24 (Family)"),
)}
ALIASES = {"sm8750": "galaxy_s25", "sm8650": "galaxy_s24", "s25": "galaxy_s25", "s24": "galaxy_s24",
           "snapdragon_8_elite": "galaxy_s25", "snapdragon_8_gen_3": "galaxy_s24"}


def get_device(name: str) -> Device:
    key = name.lower().replace("-", "_").replace(" ", "_")
    key = ALIASES.get(key, key)
    if key not in DEVICES:
        raise RecipeError(f"unknown device {name!r}; known: {', '.join(DEVICES)} (or chipset {', '.join(d.chipset for d in DEVICES.values())})")
    return DEVICES[key]
