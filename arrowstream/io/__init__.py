"""Reading: the manifest of row-group shards, each epoch's layout, chunks, the shard reader and the stream source."""
