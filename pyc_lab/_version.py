"""The version of pyc_lab (one place; the package face and snapshots read it)."""

__version__ = "0.1.0"
