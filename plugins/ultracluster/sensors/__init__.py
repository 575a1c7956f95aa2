"""Sensors: wait_for_fleet."""
