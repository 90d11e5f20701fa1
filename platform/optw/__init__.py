"""optw: neural solvers for the Orienteering Problem with Time Windows."""

__version__ = "0.1.0"
