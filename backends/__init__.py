"""Backends: the interface, the plugin registry, and the built-in backends."""
