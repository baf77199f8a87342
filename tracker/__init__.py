"""tracker: an edge home-surveillance guard with a selectable CPU inference backend.

Importing this package imports no inference runtime and has no side effects; see docs/ARCHITECTURE.md.
"""

__version__ = "0.1.0"
