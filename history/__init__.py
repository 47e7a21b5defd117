"""Training-history stores: uncoded blobs, coded slices (both halves), atomic files."""
