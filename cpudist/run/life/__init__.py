"""A run's life after its start: its id and state (run.json), its log, listing, attaching,
detaching, stopping."""
