"""Sandboxes (Docker and local bubblewrap/rlimit) for untrusted code."""
