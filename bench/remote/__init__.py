"""client-server MoA."""
