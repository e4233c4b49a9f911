"""What is written down: the audit chain, the outbox, the ledger, the run's state, sealed secrets,
traces."""
