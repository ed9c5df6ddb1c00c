"""Policy files shipped with fak (package data): `coding-floor.json` is the default floor."""
