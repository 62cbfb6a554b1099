"""A static site of a sweep (``moesim export-site``): compact JSON per machine and per model, an index,
the JSON Schema of each file kind, and a page (``index.html`` with its script and style sheet) that reads
them from the folder beside it, also when opened from ``file://``.

:func:`write_site` takes the dict :func:`moesim.analysis.site.site_data` returns and only lays it out
into files; the page shows those numbers as they are. The schema files in ``schema/`` are the contract
with other consumers: :data:`SCHEMA_VERSION` changes whenever a field is added, removed or changes
meaning (tests/test_site.py holds each version's field lists)."""
from __future__ import annotations

from .writer import KINDS, SCHEMA_VERSION, STATIC_FILES, load_schema, site_text, write_site

__all__ = ["write_site", "site_text", "load_schema", "SCHEMA_VERSION", "KINDS", "STATIC_FILES"]
