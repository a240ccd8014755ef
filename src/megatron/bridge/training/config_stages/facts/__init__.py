"""Stage 2: what follows from the declared values (layout, GPU catalogue, overlap switches, ownership of copies,
memory estimate), read-only."""
