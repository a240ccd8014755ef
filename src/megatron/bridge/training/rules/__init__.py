"""Rules as data: the records, every rule table, and the one registry the validator, the docs and the tests read."""
