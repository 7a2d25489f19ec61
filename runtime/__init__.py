"""What may run now and what it costs: the dependency model, the arbiter, variability models, the simulator.

The pure-Python core (``deps``, ``arbiter``, ``variability``, ``simulator``)
imports no torch; see docs/ARCHITECTURE.md.
"""
