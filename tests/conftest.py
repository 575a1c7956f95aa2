"""Shared pytest set-up. Fixtures for the local UltraCluster live in tests/fixtures_localcluster.py."""
pytest_plugins = ["tests.fixtures_localcluster"]
