"""The trainer that every rank runs (`python -m cpudist.train`)."""
