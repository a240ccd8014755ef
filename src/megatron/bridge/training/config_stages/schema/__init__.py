"""Stage 1: the section dataclasses, the allowed ranges of numeric settings and the rule record."""
