"""Prices kept current from community sources: import a price map as a new dated version
of our price file (sources.py, update.py, pricefile.py) and list what changed (diff.py).
Conversions are exact (exact.py)."""
