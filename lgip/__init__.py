"""lgip."""
