"""The engine booted for a subcommand: boot (weights + tokenizer + scheduler, once), topology (P/D and pipeline
servers from their flags), nodes (the one builder of a worker's node, for `fak worker` and Ray), local (worker
processes on this host), ray (workers as Ray actors), views (the rich panels of live stats).
"""
