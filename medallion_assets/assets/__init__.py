"""The lakehouse's assets, one module per layer."""
