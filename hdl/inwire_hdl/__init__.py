"""inwire gateware."""
