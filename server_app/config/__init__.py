"""The run configuration: typed, validated settings parsed once from the run config."""
