"""Journey evals: run an agent through a scripted human journey, under interruptions,
and score what happened from the database (see docs/how-to/evals.md)."""
