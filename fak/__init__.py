"""fak: a fused agent kernel."""

__version__ = "0.1.0"
