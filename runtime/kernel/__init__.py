"""What every layer uses: errors, the clock, ids, canonical JSON, limits, failpoints, metrics."""
