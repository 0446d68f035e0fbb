"""Building blocks: sublayer connections, gates, activations, layers."""
