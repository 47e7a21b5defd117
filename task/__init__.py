"""The ML task shared by both apps: datasets, partitions, models, local training."""
