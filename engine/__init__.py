"""engine: the in-kernel model runtime (usable on its own; never imports fak/ or commands/)."""
