"""Recipes: plain functions with no required arguments returning a fresh ``ConfigContainer``."""
