"""The price file's writer: prices kept current from community sources.

The reader is one folder up (``schemas.pricing``); this package writes what it reads:
a price map imported exactly (``exact.py``, ``sources.py``) as a new dated version of
the price file (``update.py``, ``pricefile.py``), fetched where the maintained maps agree
(``refresh.py``), generated from the pinned oracles by ``make prices`` (``oracles.py``, ``generate.py``,
its deliberate differences ``decisions.py``; a tier's rates by class as the table holds
them, ``tiers.py``), and every price that changed listed (``diff.py``). Nothing on a hot
path imports it.
"""

from schemas.pricing.writer.diff import diff_tables
from schemas.pricing.writer.pricefile import price_file_text
from schemas.pricing.writer.refresh import PUBLISHED, fetch_agreed
from schemas.pricing.writer.sources import SOURCES, read_source
from schemas.pricing.writer.update import import_prices

__all__ = [
    "PUBLISHED",
    "SOURCES",
    "diff_tables",
    "fetch_agreed",
    "import_prices",
    "price_file_text",
    "read_source",
]
