"""Helpers shared by the test tiers, imported as `support.*` (tests/conftest.py puts tests/ on sys.path)."""
