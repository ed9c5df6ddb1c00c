"""fak: a fused agent kernel. Layers, lowest first: core (the kernel), tools, runtime (the booted engine),
engines and gateway, then the surfaces guard, chat and agent; errors.py is the one loose module.
"""

__version__ = "0.1.0"
