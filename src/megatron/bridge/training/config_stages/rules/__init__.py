"""Stage 4: rules as data: every rule table and the one registry the validator, the docs and the tests read."""
