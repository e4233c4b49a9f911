"""A gated call becomes a request: its packet, opened by the gate, expired by silence."""
