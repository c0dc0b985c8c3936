"""sfg: decentralised learning when devices go offline."""

from . import reproducible as _reproducible

_reproducible.apply()  # SFG_REPRODUCIBLE=1: pin the numerical libraries before they load
__version__ = "0.1.0"
