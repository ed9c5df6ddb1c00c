"""The policies shipped inside the package, as data: coding-floor.json, the default floor
(fak.core.policy.coding_floor reads it through importlib.resources). No code."""
