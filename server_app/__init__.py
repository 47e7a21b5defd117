"""Server side of Sharding Eraser: the ServerApp, history store and evaluation."""
