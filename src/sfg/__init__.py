"""sfg: decentralised learning when devices go offline."""
__version__ = "0.1.0"
