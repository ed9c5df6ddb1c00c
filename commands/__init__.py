"""commands: one module per `fak` subcommand: flags, rendering, wiring."""
