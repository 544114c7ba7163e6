"""The local control plane: supervises engine, router (and later Redis) processes on one machine."""
