"""Who reads what: consumers, work segments, merged states, even-batches targets."""
