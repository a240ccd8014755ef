"""Helpers shared by the training entry points."""
