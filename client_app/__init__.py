"""Client side of Sharding Eraser: datasets, partitions and models."""
