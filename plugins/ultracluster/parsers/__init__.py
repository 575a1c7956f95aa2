"""Parsers: every tool's output read in one place, tested against real captured output (tests/fixtures)."""
