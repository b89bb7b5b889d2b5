"""The recipes CI trusts, named outside the store: the gate judges an artifact by the recipe its manifest pins, and
that recipe is kept in the store itself (``recipes/<hash>.json``, the run report), so a forger who edits the store
consistently could mint a recipe with lowered thresholds or ``expect_blocked: false`` and re-pin the manifest to it.
Against that, CI names what it trusts (``omni-export gate --trust shipped --trust PATH``) and the pinned recipe must be
the trusted recipe of the same name, with at most the command-line overrides ``omni-export recipe`` applies
(``--preset``, ``--seed``, ``--checkpoint``, ``--context``, ``--device``, ``--simulator-steps``, ``--parts``)
replayed on it: any other difference (a threshold, ``expect_blocked``, a prompt set, a build, an option) fails.

Without ``--trust`` the gate trusts the shipped recipes: an artifact of a shipped recipe's name is held to it, one of
any other name is judged by its store's recipe and the gate says so (a skipped case, never a pass). With ``--trust``
every recipe in the store must be covered by what was named.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import BadInput, OmniError

SHIPPED = "shipped"


@dataclass
class Trust:
    recipes: dict = field(default_factory=dict)   # name -> (Recipe, where it came from)
    explicit: bool = False                        # --trust given: a recipe not named fails

    @classmethod
    def named(cls, specs: list[str] | None) -> "Trust":
        """``specs``: ``shipped`` and/or recipe file paths (None: the default, ``shipped`` alone, not explicit)."""
        from ..recipes import load_recipe, shipped

        out = cls(explicit=bool(specs))
        for spec in specs or [SHIPPED]:
            if spec == SHIPPED:
                found = [(n, load_recipe(n), f"the shipped recipe {n}") for n in shipped()]
            else:
                try:
                    r = load_recipe(spec)
                except OmniError as e:
                    raise BadInput(f"--trust {spec}: {e}") from None
                found = [(r.name, r, f"the trusted recipe file {spec}")]
            for name, r, where in found:
                if name in out.recipes and out.recipes[name][0].hash != r.hash:
                    raise BadInput(f"--trust names two different recipes called {name!r} ({out.recipes[name][1]} "
                                   f"and {where}); name one")
                out.recipes.setdefault(name, (r, where))
        return out

    def check(self, name: str, pinned) -> tuple[str | None, str]:
        """(problem or None, what was trusted) for the recipe ``pinned`` that an artifact of recipe ``name`` pins.
        The problem is None with ``what`` starting "untrusted" when nothing was named for it (default mode)."""
        if name not in self.recipes:
            if self.explicit:
                return (f"recipe {name} is not one CI trusts (not covered by --trust): name its recipe file with "
                        "--trust PATH"), ""
            return None, f"untrusted: {name} is not a shipped recipe, so it is judged by the store's own copy " \
                         "(name its file with --trust PATH to hold it to one)"
        trusted, where = self.recipes[name]
        if pinned is None:
            return None, where
        diff = differences(trusted, pinned)
        if diff is None:
            return None, where
        return (f"the pinned recipe {pinned.hash[:12]}… is not {where} (replayed with its command-line overrides): "
                f"it differs in {diff}"), where


def overrides_of(pinned) -> dict:
    """The ``Recipe.with_overrides`` keywords that reproduce ``pinned``'s command-line overrides."""
    parts = {opts.get("parts") for opts in pinned.options.values()} if pinned.options else set()
    return {"preset": pinned.model.preset, "seed": pinned.model.seed, "checkpoint": pinned.model.checkpoint,
            "context": pinned.context, "device": pinned.device, "simulator_steps": pinned.parity.simulator_steps,
            "parts": parts.pop() if len(parts) == 1 and None not in parts and
            set(pinned.components) <= set(pinned.options) else None}


def _diff(a, b, key: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{key}.{k}" if key else k)]
    return [] if a == b else [key]


def differences(trusted, pinned) -> str | None:
    """None when ``pinned`` is ``trusted`` with ``omni-export recipe``'s command-line overrides replayed, else the
    first keys that differ (e.g. ``thresholds.w8a8``, ``expect_blocked``)."""
    try:
        expected = trusted.with_overrides(**overrides_of(pinned))
    except OmniError as e:
        return f"overrides the trusted recipe refuses ({e})"
    keys = _diff(expected.to_dict(), pinned.to_dict(), "")
    if not keys:
        return None
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
